"""`specsteer-companion ray serve --config FILE`: the companion as a Ray Serve application.

Thin over `ray_app` (deployments) and `ray_config` (the file); says clearly when Ray is not
installed or no cluster answers.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Annotated, NoReturn

import typer

from specsteer.errors import SpecSteerError

ray_app = typer.Typer(help="Serve on a Ray cluster (pip install 'specsteer-companion[ray]').",
                      no_args_is_help=True)


@ray_app.command("serve")
def serve_on_ray(
    config: Annotated[Path, typer.Option(help="YAML file (see examples/ray-cluster.yaml)")],
) -> None:
    """Deploy the ingress and the verifier replicas, print the URL, and serve until stopped."""
    from specsteer_companion.ray_config import load_config

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    try:
        settings = load_config(config)  # reads YAML, which comes with the ray extra
        from specsteer_companion import ray_app as deployment
    except ImportError as exc:
        _fail(f"Ray Serve is not installed (no module {exc.name!r}): "
              "pip install 'specsteer-companion[ray]'")
    except SpecSteerError as exc:
        _fail(str(exc))
    try:
        url = deployment.start(settings)
    except (deployment.RayUnavailable, SpecSteerError) as exc:
        _fail(str(exc))
    typer.echo(f"companion ready on Ray: {url} (app {settings.app_name})")
    deployment.wait_forever()


def _fail(message: str) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(1)
