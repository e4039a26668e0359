"""The ``sandbox-service`` command: ``serve`` (embedded service), ``run FILE`` (one execution),
``api`` and ``worker`` (the two node kinds of Redis mode), ``keys add|list|revoke`` (the API
key file).

Every setting is a flag and a ``SANDBOX_*`` variable; flags win. ``--help`` on a command
lists them all with their defaults (``run --help-settings`` for ``run``, whose ``--help``
shows its own options only).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from pydantic import ValidationError
from pydantic_core import PydanticUndefined

from sandbox_service.models import ExecuteRequest, ExecuteResult, Mode, Status
from sandbox_service.settings import SLOTS_PER_CORE, Settings
from sandbox_service.tenants import (
    NUMBERS,
    KeyFileError,
    Tenant,
    append_key,
    key_id,
    read_keys,
    revoke_keys,
    tenants_of,
)

Command = Callable[[argparse.Namespace, Settings], int]
COMMANDS: dict[str, tuple[str, Command, Callable[[argparse.ArgumentParser], None] | None]] = {}


def command(name: str, summary: str, extra: Callable[[argparse.ArgumentParser], None] | None = None,
            ) -> Callable[[Command], Command]:  # fmt: skip
    def register(fn: Command) -> Command:
        COMMANDS[name] = (summary, fn, extra)
        return fn

    return register


def _default_text(name: str) -> str:
    field = Settings.model_fields[name]
    if field.default is not PydanticUndefined:
        value = field.default
    elif field.default_factory is not None:
        value = field.default_factory()  # type: ignore[call-arg]
        if name in ("slots", "cores"):
            return {"slots": f"{SLOTS_PER_CORE} per CPU", "cores": "number of CPUs"}[name]
    else:
        return "required"
    if isinstance(value, list):
        return ",".join(value) or "none"
    if name == "warmup":
        return "common sympy and numpy calls"
    if name == "memory_budget_mb" and value is None:
        return "what this process may use, less the zygotes'"
    return repr(value) if isinstance(value, str) else str(value)


SETTINGS_TITLE = "settings (flag, or SANDBOX_<NAME> in the environment)"


def add_settings(parser: argparse.ArgumentParser, shown: bool = True) -> None:
    """Every setting as a flag; listed in ``--help`` only where ``shown`` (``run`` takes them
    all but lists them under ``--help-settings``: its own options would drown in ~70)."""
    group = parser.add_argument_group(SETTINGS_TITLE)
    for name, field in Settings.model_fields.items():
        group.add_argument(
            f"--{name.replace('_', '-')}",
            dest=f"setting_{name}",
            default=argparse.SUPPRESS,
            metavar=name.upper(),
            help=f"{field.description} [default: {_default_text(name)}]" if shown else
            argparse.SUPPRESS,
        )  # fmt: skip


class _SettingsHelp(argparse.Action):
    """``--help-settings``: the settings a command takes, then exit."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs: object) -> None:
        why = "list the server settings this command also takes, and exit"
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, help=why)

    def __call__(self, parser: argparse.ArgumentParser, *_: object) -> None:
        listing = argparse.ArgumentParser(prog=parser.prog, add_help=False,
                                          usage=f"{parser.prog} [SETTINGS]")  # fmt: skip
        add_settings(listing)
        listing.print_help()
        parser.exit()


def settings_from(args: argparse.Namespace) -> Settings:
    overrides = {
        k.removeprefix("setting_"): v for k, v in vars(args).items() if k.startswith("setting_")
    }
    return Settings(**overrides)


def configure_logging(level: str) -> None:
    """For the long-running commands (serve, api, worker): one line per record, to stderr."""
    logging.basicConfig(
        level=level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )


# ---------------------------------------------------------------- serve


@command("serve", "run the service: HTTP API and local slots in one process, no Redis needed")
def cmd_serve(args: argparse.Namespace, settings: Settings) -> int:
    from sandbox_service.http_server import serve

    configure_logging(settings.log_level)
    serve(settings)
    return 0


# ---------------------------------------------------------------- run


def _run_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", help="Python file to run ('-' reads standard input)")
    parser.add_argument("--stdin-file", help="file whose content is the program's stdin")
    parser.add_argument("--timeout", type=float, default=10.0, help="wall-clock limit, seconds")
    parser.add_argument("--memory", type=int, default=1024, help="address-space limit, MiB")
    parser.add_argument("--repl", action="store_true", help="print the repr of a final expression")
    parser.add_argument("--url", help="send to a running service instead of starting a slot "
                        "(with auth on, the key from SANDBOX_API_KEY)")  # fmt: skip
    parser.add_argument("--json", action="store_true", help="print the whole result as JSON")
    parser.add_argument("--help-settings", action=_SettingsHelp)


async def _run_locally(request: ExecuteRequest, settings: Settings) -> ExecuteResult:
    from sandbox_service.runtime.embedded import EmbeddedRuntime

    # Beside a running service the default slot uids are taken and this one-off slot moves to
    # the next free range: expected here, so not a warning on every run.
    logging.getLogger("sandbox_service.executor.uids").setLevel(logging.ERROR)
    runtime = EmbeddedRuntime(settings.model_copy(update={"slots": 1}), name="cli")
    await runtime.start()
    try:
        [result] = await runtime.queue.submit([request])
        return result
    finally:
        await runtime.stop()


async def _run_remotely(request: ExecuteRequest, url: str) -> ExecuteResult:
    from sandbox_service.client import AsyncSandboxClient

    async with AsyncSandboxClient(url) as client:
        return await client.execute(request)


def exit_status(result: ExecuteResult) -> int:
    """The program's own exit code; 124 for a timeout (as GNU timeout); 1 for other failures."""
    if result.exit_code is not None and result.status in (
        Status.ok,
        Status.error,
        Status.memory_limit,
    ):
        return result.exit_code
    return 124 if result.status is Status.timeout else (0 if result.status is Status.ok else 1)


@command(
    "run", "run one file in a sandbox and print what it printed and how it ended", _run_options
)
def cmd_run(args: argparse.Namespace, settings: Settings) -> int:
    source = sys.stdin.read() if args.file == "-" else Path(args.file).read_text("utf-8")
    stdin = Path(args.stdin_file).read_text("utf-8") if args.stdin_file else ""
    request = ExecuteRequest(
        code=source,
        stdin=stdin,
        timeout_s=args.timeout,
        memory_mb=args.memory,
        mode=Mode.repl if args.repl else Mode.script,
    )
    if args.url:
        result = asyncio.run(_run_remotely(request, args.url))
    else:
        result = asyncio.run(_run_locally(request, settings))
    if args.json:
        print(json.dumps(result.model_dump(mode="json"), indent=2))
    else:
        sys.stdout.write(result.stdout)
        sys.stderr.write(result.stderr)
        why = f" ({result.message})" if result.message else ""
        print(
            f"[sandbox] {result.status.value}{why}: exit_code={result.exit_code} "
            f"signal={result.signal} wall={result.wall_time_s:.3f}s cpu={result.cpu_time_s:.3f}s "
            f"peak={result.peak_memory_mb:.0f}MiB",
            file=sys.stderr,
        )
    return exit_status(result)


# ---------------------------------------------------------------- api, worker (Redis mode)


@command("api", "run an API node: the HTTP API in front of a Redis queue (--redis-url)")
def cmd_api(args: argparse.Namespace, settings: Settings) -> int:
    from sandbox_service.http_server import serve
    from sandbox_service.runtime.redis import RedisRuntime

    configure_logging(settings.log_level)
    serve(settings, RedisRuntime(settings))
    return 0


def _worker_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--burst", action="store_true", help="take jobs until the queue is empty, then exit"
    )


@command("worker", "run a worker node: slots that take jobs from a Redis queue", _worker_options)
def cmd_worker(args: argparse.Namespace, settings: Settings) -> int:
    from sandbox_service.executor.pool import IsolationUnavailable
    from sandbox_service.executor.slot import SlotStartError
    from sandbox_service.worker_node import run_worker

    configure_logging(settings.log_level)
    try:
        return run_worker(settings, burst=args.burst)
    except (SlotStartError, IsolationUnavailable) as exc:
        print(f"sandbox-service worker: {exc}", file=sys.stderr)
        return 1


# ---------------------------------------------------------------- keys


def _keys_options(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    add = actions.add_parser("add", help="append a new key for TENANT; the key is printed last")
    add.add_argument("tenant", help="tenant name: 1-64 of A-Z a-z 0-9 _ . -")
    for name, kind in NUMBERS.items():
        flag = f"--{name.replace('_', '-')}"
        why = f"the tenant's {name} (default: as its other keys; or none)"
        add.add_argument(flag, type=kind, dest=f"quota_{name}", help=why)
    add.add_argument("--admin", action="store_true", help="the key may read /metrics")
    listing = actions.add_parser("list", help="every key: id, tenant, options, revoked or not")
    revoke = actions.add_parser("revoke", help="revoke a key by its id, or every key of a tenant")
    revoke.add_argument("which", help="a key id (as `keys list` shows it) or a tenant name")
    for sub in (add, listing, revoke):
        sub.add_argument("--file", required=True, help="the key file (created 0600 by add)")


def _tenant_to_add(args: argparse.Namespace) -> Tenant:
    given = {
        name: getattr(args, f"quota_{name}")
        for name in NUMBERS
        if getattr(args, f"quota_{name}") is not None
    }
    known = tenants_of(read_keys(args.file)) if Path(args.file).exists() else {}
    base = known.get(args.tenant, Tenant(name=args.tenant))
    if given or args.admin:
        base = Tenant(name=args.tenant, admin=args.admin, **given)
    return base


@command("keys", "manage the API key file: keys add|list|revoke --file FILE", _keys_options)
def cmd_keys(args: argparse.Namespace, settings: Settings) -> int:
    if args.action == "add":
        key, line = append_key(args.file, _tenant_to_add(args))
        print(f"added key {key_id(line.digest)} for tenant {line.tenant.name} to {args.file}")
        print("the key (shown only now; the file keeps its hash):")
        print(key)
    elif args.action == "list":
        for line in read_keys(args.file):
            print(f"{key_id(line.digest)}  {line.text().split(' ', 1)[1]}")
    else:
        revoked = revoke_keys(args.file, args.which)
        if not revoked:
            print(f"no live key with id or tenant {args.which!r} in {args.file}", file=sys.stderr)
            return 1
        for line in revoked:
            print(f"revoked key {key_id(line.digest)} of tenant {line.tenant.name}")
    return 0


# ---------------------------------------------------------------- main


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(
        prog="sandbox-service",
        description="Fast, isolated execution of model-written Python for agentic RL.",
    )
    subs = top.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (summary, _, extra) in COMMANDS.items():
        sub = subs.add_parser(name, help=summary, description=summary)
        if extra is not None:
            extra(sub)
        add_settings(sub, shown=name != "run")
    return top


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        settings = settings_from(args)
    except ValidationError as exc:
        for err in exc.errors(include_url=False):
            where = ".".join(str(p) for p in err["loc"])
            print(f"sandbox-service: invalid setting {where}: {err['msg']}", file=sys.stderr)
        return 2
    _, fn, _ = COMMANDS[args.command]
    try:
        return fn(args, settings)
    except KeyboardInterrupt:
        return 130
    except (OSError, RuntimeError) as exc:  # start-up refusals: isolation, preloads, slots
        print(f"sandbox-service: {exc}", file=sys.stderr)
        return 1
    except KeyFileError as exc:  # the API key file does not parse: the message names the line
        print(f"sandbox-service: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
