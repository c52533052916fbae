"""How every service starts: the same steps in the same order for the four `python -m services.<name>`.

    from services.<name>.settings import Settings
        the caller's import: pydantic-settings, no torch
    parse_cli(prog, __doc__, argv, settings=Settings)
        --help answers here, before anything heavy is imported, and lists the RL_* variables
        Settings reads (environment_help: the one way environment help is written)
    settings, run = start_service("<name>", Settings)
        settings from RL_* (a clear exit, not a traceback, when one is missing or wrong), logging,
        the run file, and the resolved settings and run config logged once
    on_stop_signal(callback)
        SIGTERM / SIGINT -> the service's own graceful stop

This module imports only the standard library at import time, so `--help` stays instant.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import types
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from pydantic import BaseModel
    from pydantic_settings import BaseSettings

    from shared.config import ProcessSettings, RunConfig

S = TypeVar("S", bound="ProcessSettings")

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def parse_cli(
    prog: str,
    description: str | None,
    argv: Sequence[str] | None = None,
    *,
    settings: type[BaseSettings],
) -> argparse.Namespace:
    """The services take no arguments (they read RL_* variables); this gives them `--help`, which lists the
    variables `settings` reads (environment_help)."""
    parser = argparse.ArgumentParser(
        prog=prog,
        description=description,
        epilog="environment:\n" + environment_help(settings),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    return parser.parse_args(argv)


def environment_variable(settings: type[BaseSettings], name: str) -> str:
    """The environment variable a settings field is read from: its alias, else the class's prefix + its name."""
    alias = settings.model_fields[name].validation_alias
    if isinstance(alias, str):
        return alias
    return f"{settings.model_config.get('env_prefix', '')}{name}".upper()


def environment_help(settings: type[BaseSettings]) -> str:
    """One entry per variable `settings` reads, from the fields themselves: the name, the description, and
    the default ("required" where there is none; a secret's default is never shown)."""
    import textwrap

    lines = []
    for name, field in settings.model_fields.items():
        if field.is_required():
            default = "required"
        elif field.default is None:
            default = "default: unset"
        else:
            default = f"default {field.default}"
        text = f"{field.description or ''} ({default})"
        lines += textwrap.wrap(
            text,
            width=116,
            initial_indent=f"  {environment_variable(settings, name):<34}",
            subsequent_indent=" " * 36,
        )
    return "\n".join(lines)


def start_service(name: str, settings_type: type[S]) -> tuple[S, RunConfig]:
    """Settings from the environment, logging, the run file; logs the resolved configuration and
    returns (settings, run config)."""
    from pydantic import ValidationError

    try:
        settings = settings_type()
    except ValidationError as exc:  # a missing RL_SIGNING_KEY and the like: say which, no traceback
        sys.exit(f"{name} settings (RL_* environment variables): {exc}")
    logging.basicConfig(level=settings.log_level.upper(), format=LOG_FORMAT)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request otherwise
    log = logging.getLogger(f"services.{name}")
    try:
        run = settings.load_run()
    except (OSError, ValueError) as exc:  # no such run file, or one that does not validate
        sys.exit(f"{name}: run file {settings.run_config}: {exc}")
    log.info("settings: %s", describe_settings(settings))
    log.info("run config: %s", run.model_dump_json())
    return settings, run


def on_stop_signal(stop: Callable[[], None]) -> None:
    """SIGTERM and SIGINT call `stop` (which must only ask the service to stop: it runs in a signal handler)."""
    log = logging.getLogger(__name__)

    def handle(signum: int, frame: types.FrameType | None) -> None:
        log.info("received %s: stopping", signal.Signals(signum).name)
        stop()

    signal.signal(signal.SIGTERM, handle)
    signal.signal(signal.SIGINT, handle)


def describe_settings(settings: BaseModel) -> str:
    """The settings as one JSON line for the log, with no secret in it: SecretStr fields print as
    '**********' (pydantic), and a password inside a URL (RL_REDIS_URL=redis://user:pw@host) as '***'."""
    import json

    values = settings.model_dump(mode="json")
    return json.dumps(
        {name: redact_url_password(value) if isinstance(value, str) else value for name, value in values.items()}
    )


def redact_url_password(text: str) -> str:
    """`scheme://user:password@host...` with the password replaced by '***'; any other text unchanged."""
    from urllib.parse import urlsplit, urlunsplit

    try:
        parts = urlsplit(text)
    except ValueError:
        return text
    if not parts.scheme or parts.password is None:
        return text
    userinfo = f"{parts.username or ''}:***"
    host = parts.hostname or ""
    netloc = f"{userinfo}@{host}" + (f":{parts.port}" if parts.port is not None else "")
    return urlunsplit(parts._replace(netloc=netloc))
