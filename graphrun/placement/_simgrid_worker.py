"""Run flow sets in SimGrid and print their finish times (a standalone script).

Run as ``python _simgrid_worker.py`` with JSON on stdin::

    {"flowsets": [{"machines": [{"egress": Bps, "ingress": Bps}, ...],
                   "flows": [{"src": i, "dst": j, "size": bytes, "start": seconds}, ...]},
                  ...]}

prints ``{"finish": [[t, ...], ...]}`` (per flow set, per flow). Every flow set gets its
own machines, so all sets run in one SimGrid engine (which is a process
singleton) without interfering. Each machine is two SimGrid links (egress, ingress)
of zero latency; a route a -> b crosses egress(a) and ingress(b). The CM02 model with
latency, bandwidth factors, the TCP window bound and cross-traffic all neutralised is
pure max-min fair bandwidth sharing — the fluid model of ``oes.max_min_rates``.

This file imports nothing from graphrun: it runs in a child process whose ``sys.path``
gets Debian's ``/usr/lib/python3/dist-packages`` (where ``python3-simgrid`` lives).
"""

from __future__ import annotations

import json
import sys

DIST_PACKAGES = "/usr/lib/python3/dist-packages"
CONFIG = (
    "network/model:CM02",
    "network/latency-factor:1.0",
    "network/bandwidth-factor:1.0",
    "network/weight-S:0.0",
    "network/crosstraffic:0",
    "network/TCP-gamma:0",
    "maxmin/precision:1e-12",
    "surf/precision:1e-12",
)


def main() -> None:
    if DIST_PACKAGES not in sys.path:
        sys.path.append(DIST_PACKAGES)
    import simgrid as sg

    req = json.load(sys.stdin)
    flowsets = [fs["flows"] for fs in req["flowsets"]]
    args = ["graphrun-crosscheck", "--log=root.thres:critical"]
    engine = sg.Engine(args + [f"--cfg={c}" for c in CONFIG])
    zone = sg.NetZone.create_full_zone("zone")
    finish: list[list[float]] = [[0.0] * len(fs) for fs in flowsets]
    hosts = []
    for k, spec in enumerate(req["flowsets"]):
        machines = spec["machines"]
        hs, eg, ing = [], [], []
        for m, mach in enumerate(machines):
            hs.append(zone.create_host(f"h{k}_{m}", 1e9).seal())
            eg.append(zone.create_link(f"e{k}_{m}", float(mach["egress"])).set_latency(0).seal())
            ing.append(zone.create_link(f"i{k}_{m}", float(mach["ingress"])).set_latency(0).seal())
        for a in range(len(machines)):
            for b in range(len(machines)):
                if a != b:
                    route = [sg.LinkInRoute(eg[a]), sg.LinkInRoute(ing[b])]
                    zone.add_route(hs[a].netpoint, hs[b].netpoint, None, None, route, False)
        hosts.append(hs)
    zone.seal()

    def sender(k: int, i: int, flow: dict) -> None:
        if flow["start"] > 0:
            sg.this_actor.sleep_for(float(flow["start"]))
        sg.Comm.sendto(hosts[k][flow["src"]], hosts[k][flow["dst"]], int(flow["size"]))
        finish[k][i] = sg.Engine.clock

    for k, fs in enumerate(flowsets):
        for i, flow in enumerate(fs):
            sg.Actor.create(f"f{k}_{i}", hosts[k][flow["src"]], sender, k, i, flow)
    engine.run()
    json.dump({"finish": finish}, sys.stdout)


if __name__ == "__main__":
    main()
