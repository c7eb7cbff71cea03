"""`specdeploy`: the command line. Every Makefile target is a thin call into this."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

from rich.console import Console

from specdeploy import __version__, converged, inventory, timing, verify
from specdeploy.connection import HostConnection
from specdeploy.engine_image import dockerfile, profiles
from specdeploy.errors import SpecdeployError
from specdeploy.fleet import schedule
from specdeploy.monitoring import consoles
from specdeploy.patches import commands as patch_commands
from specdeploy.paths import project_root, state_dir
from specdeploy.playbook import run_playbook, unreachable_sentence
from specdeploy.preflight import memory, model_files
from specdeploy.report import pages as report_pages
from specdeploy.report.reading import DEFAULT_LAST as REPORT_LAST
from specdeploy.serve import deploy as serve_deploy
from specdeploy.serve import endpoint
from specdeploy.serve import hosts as serving_hosts
from specdeploy.serve.config import CONTAINER
from specdeploy.targets import SshSettings, Target, hold_forwards, probe
from specdeploy.watch import cli as watch_cli

err = Console(stderr=True, highlight=False)
TESTBED_PLAYBOOK = "testbed/site.yml"  # the test bed's models, then ansible/site.yml


def local_testbed() -> Any:
    """The checkout's test bed package; an installed specdeploy has none and needs --host."""
    try:
        from specdeploy_testbed import testbed  # noqa: PLC0415 (never shipped in the wheel)
    except ImportError as exc:
        raise SpecdeployError(
            "no --host given, and the local test bed is not installed (it exists only in a specdeploy checkout)",
            hint="name the host: specdeploy deploy --host user@host[:port] (or HOST=... with make)",
        ) from exc
    return testbed


def _existing_file(value: str) -> Path:
    path = Path(value).expanduser()
    if not path.is_file():
        raise argparse.ArgumentTypeError(f"{value}: no such file")
    return path.resolve()


def _add_target_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", help="user@host[:port]; default: the local test bed")
    parser.add_argument("--ssh-key", type=_existing_file, help="private key for --host (default: ssh's own)")
    parser.add_argument(
        "--known-hosts",
        type=_existing_file,
        action="append",
        default=[],
        help="known_hosts file(s) for --host (default: ~/.ssh/known_hosts); host keys are always checked",
    )


def target_inventory(args: argparse.Namespace, bring_up_testbed: bool) -> Path:
    """The inventory to run against: the test bed's, or one generated for --host after a probe."""
    if not args.host:
        testbed = local_testbed()
        tb = testbed.paths()
        if bring_up_testbed:
            testbed.prefetch_wheelhouse()  # in the background, while the hosts come up
            testbed.up(args.testbed_hosts, fleet=getattr(args, "fleet", False), nnodes=getattr(args, "nnodes", 1))
        elif not tb.inventory.is_file():
            raise SpecdeployError("the local test bed is not up", hint="run `make deploy` or `make testbed` first")
        return Path(tb.inventory)
    target = Target.parse(args.host)
    settings = SshSettings(known_hosts=tuple(args.known_hosts), identity_file=args.ssh_key)
    probe(target, settings)
    path = state_dir() / "targets" / target.name / "hosts.yml"
    # Named with its port unless 22: two hosts behind one address must not share cached facts.
    name = target.host if target.port == 22 else target.name
    text = inventory.render([inventory.InventoryHost(name, target)], settings, "targets", f"--host {target}")
    inventory.write(path, text)
    return path


def cmd_testbed(args: argparse.Namespace) -> int:
    testbed = local_testbed()
    if args.action == "up":
        testbed.up(args.hosts, fleet=args.fleet, nnodes=args.nnodes)
    elif args.action == "down":
        testbed.down(purge=args.purge)
    else:
        print("\n".join(f"{name}\t{state}\t{addr}" for name, state, addr in testbed.status()) or "the test bed is down")
    return 0


def cmd_deploy(args: argparse.Namespace) -> int:
    began, clock = time.time(), time.monotonic()
    inv = target_inventory(args, bring_up_testbed=True)
    testbed_s = None if args.host else time.monotonic() - clock
    timing_file = state_dir() / "timing" / "playbook.json"  # the callback's seconds per role
    timing_file.parent.mkdir(parents=True, exist_ok=True)
    timing_file.unlink(missing_ok=True)
    os.environ[timing.TIMING_ENV] = str(timing_file)
    extra = ["--tags", args.tags] if args.tags else []
    for value in args.extra_vars:
        extra += ["--extra-vars", value]
    if args.check:
        extra.append("--check")
    if not args.host and local_testbed().is_fleet():
        # The fleet test bed's engines have API keys from ansible-vault; its password is local state.
        extra += ["--vault-password-file", str(local_testbed().paths().root / "vault-password")]
    # Only a whole run proves a state, and only a proven one may stand in for the next whole run.
    whole = not (args.tags or args.check)
    digest = converged.inputs_digest(project_root(), inv, args.extra_vars) if whole else ""
    clock = time.monotonic()
    check = converged.proven(inv, digest) if whole and not args.full else converged.Reading(None)
    found = check.hosts
    if check.why_not:
        err.print(f"[yellow]not converged[/]: {check.why_not}; running the playbook")
    if found is not None:
        for host, reading in found.items():
            container_id, image_id = reading["container"][:2]
            said = check.proofs[host].said
            err.print(f"converged: {host}: the records are as the last whole deploy left them; engine "
                      f"{container_id[:12]} runs image {image_id[7:19]}, running; {said}")  # fmt: skip
        err.print("  the playbook was not run: nothing it would change (make deploy FULL=1 runs it all)")
        _print_table(began, testbed_s, timing_file, proof_s=time.monotonic() - clock)
        err.print(f"[green]deploy ok[/]: {len(found)} host(s), changed=0")
        _print_next(args)
        return 0
    run = run_playbook(inv, *extra, playbook="ansible/site.yml" if args.host else TESTBED_PLAYBOOK)
    if whole and run.returncode == 0:
        converged.remember(inv, digest)
    else:
        converged.forget(inv)
    _print_table(began, testbed_s, timing_file)
    if run.returncode != 0:
        err.print(f"[red]deploy failed[/] (ansible-playbook exited {run.returncode}); see the failed task above")
        if lost := unreachable_sentence(run.recap):
            err.print(f"[red]deploy stopped[/]: {lost}")
        return 1
    err.print(f"[green]deploy ok[/]: {len(run.recap)} host(s), changed={run.changed}")
    _print_next(args)
    return 0


def _print_table(began: float, testbed_s: float | None, timing_file: Path, proof_s: float | None = None) -> None:
    made = os.environ.get("SPECDEPLOY_MAKE_START", "")  # `make deploy`'s start, before its set-up
    for line in timing.deploy_table(
        began=began,
        make_start=float(made) if made else None,
        testbed_s=testbed_s,
        timing_file=timing_file,
        runs_root=state_dir() / "runs",
        ended=time.time(),
        proof_s=proof_s,
    ):
        err.print(line, markup=False, highlight=False, soft_wrap=True)  # one line a row, however wide


def _print_next(args: argparse.Namespace) -> None:
    on = f" HOST={args.host}" if args.host else ""
    err.print(f"next: make verify{on}   make endpoint{on} (the API here)   make logs{on}   make status{on}   "
              f"make rollback{on}")  # fmt: skip


def cmd_verify(args: argparse.Namespace) -> int:
    hosts = serving_hosts.inventory_hostvars(target_inventory(args, bring_up_testbed=False))
    checked = [verify.HostUnderCheck(name, HostConnection.from_hostvars(hv), hv) for name, hv in hosts.items()]
    return verify.run(checked).returncode


def cmd_endpoint(args: argparse.Namespace) -> int:
    hosts = serving_hosts.inventory_hostvars(target_inventory(args, bring_up_testbed=False))
    opened = endpoint.open_endpoints(hosts, args.local_port)
    for ep, forward in opened:
        state = "" if ep.answering else "  [yellow](the engine does not answer yet: make status)[/]"
        err.print(f"endpoint: [bold]{ep.url}[/] -> {ep.host} (127.0.0.1:{forward.remote_port} there, over SSH){state}")
        if ep.api_key_set:
            err.print("  the API key is required: export OPENAI_API_KEY=<your serving_api_key>")
        for line in ep.example():
            print(f"  {line}", flush=True)
    hold_forwards([(ep.host, forward) for ep, forward in opened], err.print, "Ctrl-C closes the forward.")
    err.print("endpoint closed")
    return 0


def cmd_monitor(args: argparse.Namespace) -> int:
    if args.inventory and args.host:  # the inventory names its hosts: a --host beside it would be dropped
        raise SpecdeployError("give --inventory or --host, not both", hint="make monitor INVENTORY=... (no HOST)")
    inv = args.inventory or target_inventory(args, bring_up_testbed=False)
    listed = serving_hosts.read(inv)  # one `ansible-inventory` for the variables and the group
    opened = consoles.open_consoles(listed.hostvars, listed.group("monitoring"), args.local_port)
    for console, forward in opened:
        err.print(f"{console.part}: [bold]{console.url}[/] -> {console.host} (127.0.0.1:{forward.remote_port} "
                  f"there, over SSH): {console.state}", soft_wrap=True)  # fmt: skip
    err.print("Dashboards to import into your Grafana: .state/dashboards/ (docs/monitoring.md).")
    hold_forwards([(console.name, forward) for console, forward in opened], err.print, "Ctrl-C closes the forwards.")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    rows = serving_hosts.status(target_inventory(args, bring_up_testbed=False))
    print(json.dumps(rows, indent=2) if args.json else "\n".join(serving_hosts.status_lines(rows)))
    running = all(c.get(CONTAINER, {}).get("state") == "running" for c in rows.values())
    return 0 if rows and running else 1


def cmd_logs(args: argparse.Namespace) -> int:
    for host, text in serving_hosts.logs(
        target_inventory(args, bring_up_testbed=False), args.tail, args.container
    ).items():
        print(f"==> {host}: {args.container} (last {args.tail} lines)")
        print(text, end="" if text.endswith("\n") else "\n")
    return 0


def cmd_rollback(args: argparse.Namespace) -> int:
    run = run_playbook(target_inventory(args, bring_up_testbed=False), playbook="ansible/rollback.yml")
    if run.returncode != 0:
        err.print(f"[red]rollback failed[/] (ansible-playbook exited {run.returncode}); see the failed task above")
        return 1
    err.print("[green]rolled back[/]: the previous engine serves; `make rollback` again swaps back")
    return 0


def plan_values(inventory: str) -> dict[str, Any]:
    """The serving values of INVENTORY's first host; a relative path not found here is the checkout's."""
    path = Path(inventory)
    path = path if path.exists() or path.is_absolute() else project_root() / path
    if not path.exists():  # ansible-inventory reads a missing path as an empty inventory: no values, silently
        raise SpecdeployError(f"no inventory at {inventory}", hint="pass --inventory inventories/<name>")
    return next(iter(serving_hosts.inventory_hostvars(path).values()), {})


def cmd_plan_fit(args: argparse.Namespace) -> int:
    """One GPU's memory on paper for the inventory's first host: specdeploy.preflight.model_files decides."""
    if not args.model or not args.gpu_memory_mib:
        raise SpecdeployError("plan --fit needs --model and --gpu-memory-mib",
                              hint="e.g. --gpu-memory-mib 97887 for an RTX PRO 6000 Blackwell (96 GB)")  # fmt: skip
    values = plan_values(args.inventory)
    engine, drafter = args.engine or str(values.get("specdeploy_engine") or "vllm"), args.drafter and Path(args.drafter)
    result = model_files.local_fit(values, engine, Path(args.model), drafter or None, args.gpu_memory_mib)
    if result.fit is None:
        raise SpecdeployError(result.note, hint="give --model a folder with config.json and its *.safetensors "
                              "(or model.safetensors.index.json), and --drafter for speculation")  # fmt: skip
    title = f"{args.inventory}, one GPU of {args.gpu_memory_mib:,} MiB"
    print(json.dumps(result.as_dict()) if args.json else "\n".join(result.report(title)))
    return 1 if result.fit.problems() else 0


def cmd_plan(args: argparse.Namespace) -> int:
    if args.fit:
        return cmd_plan_fit(args)
    if args.hosts is None:
        raise SpecdeployError("plan needs --hosts (or --fit for one GPU's memory)")
    hosts = schedule.units(args.hosts or 0, args.nnodes)
    load_s, source = args.load_seconds, "given"
    if load_s is None:
        measured = schedule.last_measured_load_s(state_dir() / "runs")
        if measured is None:
            raise SpecdeployError(
                "no per-host load time: none given and no READY start-up measured here yet",
                hint="pass --load-seconds (e.g. 1500 for Kimi-K2.5 on 8 GPUs), or deploy once",
            )
        load_s, source = measured[0], f"last measured, {measured[1]}"
    load = schedule.Load(args.offered_rps, args.per_host_rps) if args.offered_rps is not None else None
    if load is not None and args.per_host_rps is None:
        raise SpecdeployError("--offered-rps needs --per-host-rps (what one engine serves)")
    starts = serve_deploy.first_rollout_starts(plan_values(args.inventory))
    result = schedule.plan(hosts, args.max_unavailable, load_s, args.drain_seconds, load, measuring=starts)
    if args.json:
        fields = {k: (None if isinstance(v, float) and math.isinf(v) else v) for k, v in vars(result).items()}
        # null: unbounded (the queue never drains, or no host serves): JSON has no Infinity.
        print(json.dumps({**fields, "capacity_min": result.capacity_min, "measuring_s": result.measuring_s,
                          "load_s_source": source}))  # fmt: skip
        return 0
    group = f" as {len(hosts)} engines of {args.nnodes} hosts each" if args.nnodes > 1 else ""
    print(f"{args.hosts} hosts{group}, rollout_max_unavailable={args.max_unavailable}, load {load_s:.0f} s ({source}); "
          f"serving_* from {args.inventory}")  # fmt: skip
    for line in result.lines():
        print(f"  {line}")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    out = Path(args.out) if args.out else state_dir() / "report"
    written = report_pages.write_report(state_dir() / "runs", out, last=args.last)
    for path in written:
        print(path)
    print(f"open it: xdg-open {written[0]}")
    return 0


def _positive_int(value: str) -> int:
    number = int(value)
    if number < 1:
        raise argparse.ArgumentTypeError(f"{value}: must be at least 1")
    return number


def cmd_patch(args: argparse.Namespace) -> int:
    return patch_commands.run(args.action, args.engine, Path(args.site_packages), args)


def cmd_watch(args: argparse.Namespace) -> int:
    try:
        return watch_cli.run(args)
    except SpecdeployError as exc:  # 2 means STALLED here, so bad input gets its own code
        err.print(f"[bold red]error:[/] {exc}")
        return watch_cli.BAD_INPUT


def cmd_image(args: argparse.Namespace) -> int:
    prof = profiles.profile(args.profile)
    base = profiles.pip_base(args.base, args.base_image, args.base_python, args.engine_version, args.pip_ca_bundle)
    built = profiles.pip_profile(prof, base) if base else prof
    if args.action == "render":
        patch_digest = args.patch_digest or profiles.expected_patch_digest(built)
        text = dockerfile.render(
            prof,
            patch_digest=patch_digest,
            drafter_digest=args.drafter_digest,
            base_digest=args.base_digest,
            sgl_kernel_build=args.sgl_kernel_build,
            base=base,
        )
        print(text, end="")
        return 0
    dest = Path(args.dest) if args.dest else dockerfile.context_dir(prof, args.drafter_digest, base)
    result = dockerfile.prepare_context(
        prof,
        dest,
        drafter_digest=args.drafter_digest,
        base_digest=args.base_digest,
        sgl_kernel_build=args.sgl_kernel_build,
        wheel=Path(args.specdeploy_wheel) if args.specdeploy_wheel else None,
        base=base,
    )
    print(json.dumps(result))
    return 0


def _add_deploy_commands(sub: Any) -> None:
    tb = sub.add_parser("testbed", help="the local test bed of SSH hosts on this machine's Docker engine")
    tb.add_argument("action", choices=["up", "down", "status"])
    tb.add_argument("--hosts", type=int, default=1, help="number of test hosts (default 1)")
    tb.add_argument("--purge", action="store_true", help="with down: also delete the hosts' engine volumes")
    tb.add_argument("--fleet", action="store_true", help="with up: the hosts behind a router on the first")
    tb.add_argument("--nnodes", type=int, default=1, help="with up --fleet: hosts per engine (one engine over them)")
    tb.set_defaults(func=cmd_testbed)

    dep = sub.add_parser("deploy", help="run ansible/site.yml against --host or the local test bed")
    _add_target_args(dep)
    dep.add_argument("--tags", help="phases to run: preflight,provision,engine_image,deploy,monitoring,verify")
    dep.add_argument(
        "--check",
        action="store_true",
        help="Ansible check mode: report, change nothing (the image build and the rollout refuse it)",
    )
    dep.add_argument("-e", "--extra-vars", action="append", default=[], help="passed to ansible-playbook")
    dep.add_argument("--full", action="store_true",
                     help="run the whole playbook even when the last one's state is proven unchanged")  # fmt: skip
    dep.add_argument("--testbed-hosts", type=int, default=1, help=argparse.SUPPRESS)
    dep.add_argument("--fleet", action="store_true", help=argparse.SUPPRESS)
    dep.add_argument("--nnodes", type=int, default=1, help=argparse.SUPPRESS)
    dep.set_defaults(func=cmd_deploy)

    ver = sub.add_parser("verify", help="testinfra checks of --host or the local test bed over SSH")
    _add_target_args(ver)
    ver.set_defaults(func=cmd_verify)


def _add_serving_commands(sub: Any) -> None:
    sta = sub.add_parser("status", help="the engine containers on --host or the local test bed")
    _add_target_args(sta)
    sta.add_argument("--json", action="store_true", help="print JSON")
    sta.set_defaults(func=cmd_status)

    log = sub.add_parser("logs", help="the engine's log on --host or the local test bed")
    _add_target_args(log)
    log.add_argument("--tail", type=int, default=200, help="lines (default 200)")
    log.add_argument("--container", default=CONTAINER, help=f"default {CONTAINER}; also {CONTAINER}-failed")
    log.set_defaults(func=cmd_logs)

    ept = sub.add_parser("endpoint", help="the engine's API on this machine, through an SSH forward, until Ctrl-C")
    _add_target_args(ept)
    ept.add_argument("--local-port", type=int, default=endpoint.DEFAULT_LOCAL_PORT,
                     help=f"first local port (default {endpoint.DEFAULT_LOCAL_PORT}; 0: any free port)")  # fmt: skip
    ept.set_defaults(func=cmd_endpoint)

    mon = sub.add_parser("monitor", help="the monitoring host's Prometheus and Alertmanager here, over SSH forwards")
    _add_target_args(mon)
    mon.add_argument("--inventory", type=_existing_file, help="an Ansible inventory with a monitoring group "
                     "(default: the test bed's, or --host's)")  # fmt: skip
    mon.add_argument("--local-port", type=int, default=consoles.DEFAULT_LOCAL_PORT,
                     help=f"first local port (default {consoles.DEFAULT_LOCAL_PORT}; 0: any free port)")  # fmt: skip
    mon.set_defaults(func=cmd_monitor)

    pln = sub.add_parser("plan", help="a fleet rollout on paper: batches, duration, lowest capacity, queue wait; "
                         "with --fit, one GPU's memory: weights, reserve, KV cache, concurrency")  # fmt: skip
    pln.add_argument("--hosts", type=int, help="engine hosts in the fleet")
    pln.add_argument("--nnodes", type=int, default=1,
                     help="hosts per engine (serving_nnodes): a multi-node engine is one unit of capacity")  # fmt: skip
    pln.add_argument("--max-unavailable", default="1",
                     help="rollout_max_unavailable: a count or a percentage (of engines)")  # fmt: skip
    pln.add_argument("--load-seconds", type=float, help="one host's start-up to READY (default: the last measured)")
    pln.add_argument("--drain-seconds", type=float, default=0.0, help="the drain bound per host (shutdown timeout)")
    pln.add_argument("--offered-rps", type=float, help="the fleet's offered load, requests per second")
    pln.add_argument("--per-host-rps", type=float, help="what one engine serves, requests per second")
    pln.add_argument("--json", action="store_true", help="print JSON")
    pln.add_argument("--fit", action="store_true", help="the model's fit on one GPU of the inventory's first host")
    pln.add_argument("--inventory", default="inventories/local",
                     help="its serving_* values: a first rollout's measuring starts; with --fit, the fit")  # fmt: skip
    pln.add_argument("--model", help="with --fit: a folder with config.json and the *.safetensors (headers read)")
    pln.add_argument("--drafter", help="with --fit: the EAGLE-3 drafter's folder")
    pln.add_argument("--gpu-memory-mib", type=_positive_int, help="with --fit: one GPU's memory as nvidia-smi says it")
    pln.add_argument("--engine", choices=memory.ENGINES, help="with --fit: instead of specdeploy_engine")
    pln.set_defaults(func=cmd_plan)

    rbk = sub.add_parser("rollback", help="swap the running engine with the previous one, watched to READY")
    _add_target_args(rbk)
    rbk.set_defaults(func=cmd_rollback)

    rep = sub.add_parser("report", help="an HTML page per host of its rollouts: verdicts, benchmark gate, plots")
    rep.add_argument("--out", help="folder for index.html and <host>.html (default .state/report)")
    rep.add_argument("--last", type=_positive_int, default=REPORT_LAST,
                     help=f"rollouts per host (default {REPORT_LAST})")  # fmt: skip
    rep.set_defaults(func=cmd_report)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="specdeploy", description=__doc__)
    parser.add_argument("--version", action="version", version=f"specdeploy {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    _add_deploy_commands(sub)
    _add_serving_commands(sub)

    pat = sub.add_parser("patch", help="engine patch sets for EAGLE-3 on DeepSeek-V3 / Kimi-K2.5 targets")
    patch_commands.add_arguments(pat)  # the same arguments as `python -m specdeploy.patches`
    pat.set_defaults(func=cmd_patch)

    img = sub.add_parser("image", help="engine images: render the Dockerfile, prepare a build context")
    img.add_argument("action", choices=["render", "context"])
    img.add_argument("--profile", required=True, help="vllm-cpu, vllm-cuda or sglang-cuda")
    img.add_argument("--drafter-digest", required=True, help="sha256:... of the drafter (labels the image)")
    img.add_argument("--base-digest", help="sha256:... pinning the GPU profiles' base image")
    img.add_argument("--patch-digest", help="render: skip computing it from the real release")
    img.add_argument("--sgl-kernel-build", default="auto", choices=profiles.SGL_KERNEL_BUILD_MODES)
    img.add_argument("--dest", help="context: the folder to fill")
    img.add_argument("--specdeploy-wheel", help="context: install this specdeploy wheel in the image")
    img.add_argument(
        "--base",
        default="official",
        choices=profiles.BASES,
        help="vllm-cuda: the pinned official image (default), or pip install vllm onto --base-image",
    )
    img.add_argument("--base-image", help="--base pip: a plain Debian/Ubuntu image (tag or name@sha256:...)")
    img.add_argument("--base-python", default="3.11", help="--base pip: its python3 version (default 3.11)")
    img.add_argument("--engine-version", help="--base pip: install this vLLM release instead of the pinned one")
    img.add_argument("--pip-ca-bundle", help="--base pip: CA certificates pip trusts in the build (TLS proxy)")
    img.set_defaults(func=cmd_image)

    wat = sub.add_parser("watch", help="watch an engine start: READY / FAILED / STALLED, with the root cause")
    watch_cli.add_arguments(wat)
    wat.set_defaults(func=cmd_watch)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except SpecdeployError as exc:
        err.print(f"[bold red]error:[/] {exc.message}")
        if exc.hint:
            err.print(f"  [yellow]hint:[/] {exc.hint}")
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
