"""The configuration of the companion on Ray Serve: one YAML file, read and checked here.

Owns the file's schema, its defaults and the errors that say what to fix
(`CompanionConfigError`); imports nothing of Ray, so a bad file is reported before any cluster
is touched. `examples/ray-cluster.yaml` is a commented multi-machine example.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, ClassVar

from specsteer.errors import CompanionConfigError
from specsteer_companion.admission import ServerConfig
from specsteer_companion.vllm_engine import VllmOptions, resolve_model


@dataclass(frozen=True)
class ModelsSection:
    """What every verifier replica loads, once."""

    generalist: str = "qwen2.5-1.5b"
    specialist: str = "qwen2.5-0.5b"  # "none": devices send P_S0 themselves
    precision: str = "int8"  # of registry models: the Generalist's
    # a registry Specialist's; None: the one a device on the replica's CPU runs it at
    # (`ModelSpec.device_default`), so the replicas hold the devices' very artifact as P_S0;
    # set it when the devices' CPUs differ from the replicas' (w8a8 only with VNNI)
    specialist_precision: str | None = None
    threads: int = 1  # ONNX Runtime threads per model
    max_session_tokens: int = 4096
    # where the Generalist runs: "onnx" (ONNX Runtime in the replica) or "vllm" (one vLLM
    # engine per replica; `generalist` is then an HF folder or an export-hf name)
    engine: str = "onnx"
    vllm: dict[str, Any] = field(default_factory=dict)  # `vllm_engine.VllmOptions` but `model`

    def __post_init__(self) -> None:
        if self.engine not in ENGINES:
            raise CompanionConfigError(f"models.engine must be one of {', '.join(ENGINES)}, "
                                       f"not {self.engine!r}")
        if self.vllm and self.engine != "vllm":
            raise CompanionConfigError("models.vllm configures the vLLM engine: set "
                                       "models.engine: vllm, or remove it")
        _build(VllmOptions, {"model": self.generalist, **self.vllm}, "models.vllm")

    def vllm_options(self) -> VllmOptions:
        """The replica's engine options (the Generalist resolved to its HF folder)."""
        dtype = self.vllm.get("dtype", "auto")
        return VllmOptions(**{**self.vllm, "model": resolve_model(self.generalist, dtype)})


ENGINES = ("onnx", "vllm")


@dataclass(frozen=True)
class VerifierSection:
    """The verifier deployment: its replicas, their autoscaling and their size."""

    min_replicas: int = 1
    max_replicas: int = 1
    initial_replicas: int | None = None
    target_ongoing_requests: float = 2.0  # autoscaling aims at this many frames in flight
    max_ongoing_requests: int = 8  # frames one replica runs at once (its worker threads)
    max_sessions: int = 64  # sessions one replica holds (KV caches); more move to another
    num_cpus: float = 1.0
    num_gpus: float = 0.0
    health_check_period_s: float = 10.0
    health_check_timeout_s: float = 30.0
    upscale_delay_s: float = 30.0  # load above target this long before a replica is added
    downscale_delay_s: float = 600.0  # load below target this long before one is removed


@dataclass(frozen=True)
class IngressSection(ServerConfig):
    """The websocket ingress: `ServerConfig` (address and every limit an adapter enforces, with
    the same defaults), plus TLS, its CPU share and how long a verifier replica may take.

    One replica by design: it sees every connection of the cluster, so its caps, budgets and
    revocation are the cluster's, exactly as in the single-process server."""

    # not in the file: the ingress runs no model threads, and the protocol bounds are fixed
    NOT_IN_FILE: ClassVar[frozenset[str]] = frozenset({"workers", "limits"})

    num_cpus: float = 0.5
    cert: str | None = None  # TLS certificate (PEM); with `key`, devices use wss://
    key: str | None = None
    replica_timeout_s: float = 60.0  # a frame the replica does not answer in time: resync


@dataclass(frozen=True)
class RayCompanionConfig:
    """The whole file. `address`: the Ray cluster to join ("auto": the one `ray start` made on
    this machine; "local": start a private single-machine cluster)."""

    address: str = "auto"
    app_name: str = "specsteer-companion"
    tokens: str | None = None  # token store; the ingress and every verifier node read it
    open_access: bool = False  # accept any device (development only)
    models: ModelsSection = field(default_factory=ModelsSection)
    verifier: VerifierSection = field(default_factory=VerifierSection)
    ingress: IngressSection = field(default_factory=IngressSection)

    def __post_init__(self) -> None:
        v, i = self.verifier, self.ingress
        if not 0 <= v.min_replicas <= v.max_replicas or v.max_replicas < 1:
            raise CompanionConfigError(
                f"verifier: need 0 <= min_replicas <= max_replicas >= 1, got "
                f"{v.min_replicas}..{v.max_replicas}")
        counts = {"verifier.max_sessions": v.max_sessions,
                  "verifier.max_ongoing_requests": v.max_ongoing_requests}
        if small := [name for name, n in counts.items() if n < 1]:
            raise CompanionConfigError(f"{', '.join(small)} must be >= 1")
        if (i.cert is None) != (i.key is None):
            raise CompanionConfigError("ingress: TLS takes both cert and key; the companion "
                                       "does not serve plain ws:// when TLS was asked for")
        if self.tokens is None and not self.open_access:
            raise CompanionConfigError("give a token store (tokens: PATH) or open_access: true")


_SECTIONS = {"models": ModelsSection, "verifier": VerifierSection, "ingress": IngressSection}


def _build(kind: type, values: Any, where: str) -> Any:
    if values is None:
        return kind()
    if not isinstance(values, dict):
        raise CompanionConfigError(f"{where} must be a mapping")
    known = {f.name for f in fields(kind)} - getattr(kind, "NOT_IN_FILE", frozenset())
    unknown = sorted(set(values) - known)
    if unknown:
        raise CompanionConfigError(f"{where}: unknown key(s) {', '.join(unknown)}; "
                                   f"known: {', '.join(sorted(known))}")
    try:
        return kind(**values)
    except (TypeError, CompanionConfigError) as exc:
        raise CompanionConfigError(f"{where}: {exc}") from exc


def parse_config(data: Any) -> RayCompanionConfig:
    """A checked configuration from the file's parsed mapping."""
    if not isinstance(data, dict):
        raise CompanionConfigError("the configuration must be a YAML mapping")
    top = {k: v for k, v in data.items() if k not in _SECTIONS}
    sections = {name: _build(kind, data.get(name), name) for name, kind in _SECTIONS.items()}
    config = _build(RayCompanionConfig, top, "configuration")
    return RayCompanionConfig(**{**{f.name: getattr(config, f.name)
                                    for f in fields(RayCompanionConfig)}, **sections})


def load_config(path: str | Path) -> RayCompanionConfig:
    """Read and check a YAML configuration file."""
    import yaml  # Ray's own dependency: present wherever the `ray` extra is installed

    file = Path(path).expanduser()
    try:
        data = yaml.safe_load(file.read_text())
    except OSError as exc:
        raise CompanionConfigError(f"cannot read {file}: {exc.strerror or exc}") from exc
    except yaml.YAMLError as exc:
        raise CompanionConfigError(f"{file} is not valid YAML: {exc}") from exc
    return parse_config(data)
