"""Render each Grafana dashboard as a PNG from real data, for docs/observability.md.

    .venv/bin/python -m e2e.lab.dashboard_images docs/images

Starts what e2e/test_observability.py starts (a private local control plane, the operator reconciling a
good InferenceService, the member of a GPUBudget, and a broken one, the runtime on the tiny model under
load, Prometheus scraping both), lets it run for a few minutes, then draws every panel from Prometheus range
queries, laid out on the dashboard's grid. Not Grafana's look; Grafana's data (the same queries, the same
variables).
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import yaml  # noqa: E402

from e2e.lab.addons import wait_established  # noqa: E402
from e2e.lab.cluster import start_private  # noqa: E402
from e2e.lab.observability import OPERATOR_LABELS, RATE_INTERVAL, RUNTIME_LABELS, Load, Prometheus, Runtime
from e2e.lab.processes import REPO_ROOT, VENV_BIN, ManagedProcess, OperatorProcess, wait_until  # noqa: E402
from e2e.lab.samples import budget_member, gpu_budget, tiny_sample  # noqa: E402

DASHBOARDS = REPO_ROOT / "charts" / "pagoda" / "files" / "dashboards"
VARIABLES = {
    "inferenceservice": {"namespace": "ml", "service": "tiny"},
    "operator": {"namespace": "pagoda-system", "service": "pagoda-metrics"},
}


def legend(fmt: str, metric: dict[str, str]) -> str:
    out = fmt or "value"
    for key, val in metric.items():
        out = out.replace("{{" + key + "}}", val)
    return out


def stat_text(value: float, unit: str) -> str:
    if math.isnan(value):
        return "no data"
    if unit == "percentunit":
        return f"{value * 100:.3g} %"
    if unit == "bytes":
        return f"{value / 2**20:.0f} MiB"
    if unit == "s":
        return f"{value:.3g} s"
    return f"{value:.3g}"


def render(prom: Prometheus, name: str, start: float, end: float, out: Path) -> None:
    board = json.loads((DASHBOARDS / f"{name}.json").read_text())
    rows = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in board["panels"])
    fig = plt.figure(figsize=(16, rows * 0.42))
    fig.suptitle(
        f"{board['title']}  ({', '.join(f'{k}={v}' for k, v in VARIABLES[name].items())})",
        fontsize=13,
        y=0.985,
    )
    grid = fig.add_gridspec(rows, 24, hspace=1.6, wspace=1.2, top=0.96)
    for panel in board["panels"]:
        pos = panel["gridPos"]
        ax = fig.add_subplot(grid[pos["y"] : pos["y"] + pos["h"] - 1, pos["x"] : pos["x"] + pos["w"]])
        ax.set_title(panel["title"], fontsize=9, loc="left")
        ax.tick_params(labelsize=7)
        unit = panel["fieldConfig"]["defaults"].get("unit", "")
        for target in panel["targets"]:
            expr = target["expr"].replace("$__rate_interval", RATE_INTERVAL)
            for key, val in VARIABLES[name].items():
                expr = expr.replace(f"${key}", val)
            if "kube_deployment" in expr:
                continue  # kube-state-metrics is not running here
            for series in prom.query_range(expr, start, end, step="5s"):
                xs = [float(t) - end for t, _ in series["values"]]
                ys = [float(v) for _, v in series["values"]]
                if panel["type"] == "stat":
                    last = next((y for y in reversed(ys) if not math.isnan(y)), float("nan"))
                    ax.text(
                        0.5,
                        0.45,
                        stat_text(last, unit),
                        ha="center",
                        va="center",
                        fontsize=16,
                        transform=ax.transAxes,
                    )
                    ax.set_xticks([])
                    ax.set_yticks([])
                else:
                    ax.plot(
                        xs, ys, linewidth=1, label=legend(target.get("legendFormat", ""), series["metric"])
                    )
        if panel["type"] != "stat":
            ax.set_xlabel("seconds before the end of the run", fontsize=7)
            if unit:
                ax.set_ylabel(unit, fontsize=7)
            if ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize=6, loc="upper left")
    fig.savefig(out, dpi=80, bbox_inches="tight")
    plt.close(fig)


def main(argv: list[str]) -> int:
    outdir = Path(argv[0] if argv else "docs/images")
    outdir.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="pagoda-dashboard-images-"))
    cluster = start_private()
    procs: list[ManagedProcess] = []
    drawn = False
    try:
        rules = work / "rules.yaml"
        rules.write_text("groups: []\n")
        prom = Prometheus(work / "prometheus", rule_files=[rules]).start()
        procs.append(prom)
        cluster.kubectl("apply", "--server-side", "-f", str(REPO_ROOT / "crds"))
        wait_established(cluster, ["crd/inferenceservices.pagoda.dev", "crd/gpubudgets.pagoda.dev"], 60)
        cluster.kubectl("create", "namespace", "ml")
        good = tiny_sample("ml")
        broken = json.loads(json.dumps(good))
        broken["metadata"]["name"] = "tiny-broken"
        broken["spec"]["model"]["credentialsSecret"] = "does-not-exist"
        # The good one is the member of a GPUBudget, so that the operator dashboard's budget row has data.
        objects = [gpu_budget("ml-gpus", 2, "ml"), budget_member(good, "ml-gpus"), broken]
        cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(objects))
        operator = OperatorProcess(cluster.kubeconfig, work / "operator.log", resync_seconds=2).start()
        procs.append(operator)
        prom.add_target(f"127.0.0.1:{operator.port}", **OPERATOR_LABELS)
        model = work / "tiny-model"
        subprocess.run(
            [str(VENV_BIN / "pagoda-runtime"), "make-tiny-model", str(model)],
            check=True,
            capture_output=True,
            timeout=300,
        )
        runtime = Runtime(model, work / "runtime").start()
        procs.append(runtime)
        prom.add_target(f"127.0.0.1:{runtime.port}", **RUNTIME_LABELS)
        start = time.time()
        load = Load(runtime.url, runtime.served_name).start()
        wait_until(lambda: time.time() - start > 150, "the load to run", timeout=200, interval=5)
        load.stop()
        end = time.time() + 20
        wait_until(lambda: time.time() > end, "the tail of the run", timeout=60, interval=2)
        for name in VARIABLES:
            render(prom, name, start - 20, end, outdir / f"dashboard-{name}.png")
            print(f"Wrote {outdir / f'dashboard-{name}.png'}")
        drawn = True
    finally:
        for proc in reversed(procs):
            proc.stop()
        cluster.stop()
        cluster.discard(failed=not drawn)
        if drawn:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"Kept the operator's, Prometheus' and the runtime's logs in {work}.")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
