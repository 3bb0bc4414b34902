"""``hybridrl <command>`` / ``python -m core.cli <command>``.

Commands: ``selfcheck`` (start the worker groups as configured and check the runtime).
"""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="hybridrl")
    sub = parser.add_subparsers(dest="command", required=True)
    check = sub.add_parser("selfcheck", help="place the roles on Ray (or locally) and check dispatch and collectives")
    check.add_argument("--backend", choices=["ray", "local"], default="ray")
    check.add_argument("--workers", type=int, default=2, help="ranks per pool")
    check.add_argument("--split", action="store_true", help="put the reference on its own pool instead of colocating")
    args = parser.parse_args(argv)

    if args.command == "selfcheck":
        from core.config import PlacementConfig, PoolConfig
        from core.selfcheck import selfcheck

        pools = {"main": PoolConfig(slots_per_node=args.workers)}
        roles = {"actor": "main", "rollout": "main", "ref": "main"}
        if args.split:
            pools["ref"], roles["ref"] = PoolConfig(slots_per_node=args.workers), "ref"
        if args.backend == "ray":
            from core.worker_group import init_ray

            init_ray(num_cpus=max(2, len(pools) * args.workers))
        return 0 if selfcheck(PlacementConfig(pools, roles), args.backend) else 1
    return 2


if __name__ == "__main__":
    sys.exit(main())
