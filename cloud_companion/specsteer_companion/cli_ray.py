"""`specsteer-companion ray serve --config FILE`: the companion as a Ray Serve application.

Thin over `ray_app` (deployments) and `ray_config` (the file); says clearly when Ray is not
installed or no cluster answers.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Annotated

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
        settings = load_config(config)
    except SpecSteerError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    try:
        from specsteer_companion import ray_app as deployment
    except ImportError as exc:
        typer.echo(f"error: Ray Serve is not installed ({exc.name}): "
                   "pip install 'specsteer-companion[ray]'", err=True)
        raise typer.Exit(1) from None
    try:
        url = deployment.start(settings)
    except (deployment.RayUnavailable, SpecSteerError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    typer.echo(f"companion ready on Ray: {url} (app {settings.app_name})")
    deployment.wait_forever()
