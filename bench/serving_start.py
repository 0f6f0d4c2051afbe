"""From `kubectl apply` of a vLLM Deployment to its first token on the real node, side by side in one run:
- `strata-claim`: the Deployment only names a ModelCache by label (preloaded once into its claim); the webhook
  wires the volume and `--load-format strata`, and vLLM loads the weights from the claim through Strata's loader;
- `s3-pull`: what users do without Strata: an init container downloads the same model from the same S3 server into
  the pod's own emptyDir (boto3's transfer manager, as `aws s3 cp --recursive`), then vLLM loads it from there.

Both run the same serving image (vLLM on CPU, images/vllm-cpu) with the same flags on the same node; each round
creates a fresh Deployment per side, times apply -> the first one-token completion answered (polled from the moment
the pod has an address, so no readiness-probe period is counted), then deletes it and waits until its pod is gone.
Rounds alternate the order of the sides; the table gives medians with their range and the ratio. The cache's own
preload (apply -> Ready) is paid once per model and node pool, not per pod: it is printed beside.

The S3 server is moto's on the node's address (~0.1-0.2 GB/s, slower than a real object store), so the download
share of `s3-pull` is larger here than against a fast store; the result prints the measured download rate, so the
numbers can be rescaled. Two shared cores: read the ratios, not the absolutes.

    sudo .venv/bin/python bench/serving_start.py [--rounds 3] [--shape 1g|test] [--output DIR]
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "testsupport"))

from strata_operator.webhook.vllm_packages import INJECT_ANNOTATION  # noqa: E402
from strata_testsupport.kube import new_dynamic_client, resource  # noqa: E402
from strata_testsupport.localcluster.node import (  # noqa: E402
    NODE_IP,
    SERVING_IMAGE,
    RealNode,
    node_images_archive,
    serving_image_archive,
)
from strata_testsupport.pods import STATIC_CLASS, pod_log, s3_secret, static_volume, unique, wait_phase  # noqa: E402
from strata_testsupport.realnode import install_strata, pod_security_namespace  # noqa: E402
from strata_testsupport.s3 import running_s3_server  # noqa: E402
from strata_testsupport.scenarios import Site, shared_cache_from_s3  # noqa: E402
from strata_testsupport.serving import (  # noqa: E402
    MODEL_SHAPES,
    delete_deployment,
    deployment,
    first_answer,
    make_model,
    s3_pull_deployment,
    upload_model_dir,
)

SIDES = ("strata-claim", "s3-pull")
PROMPT = [7, 8, 9, 10] * 8


def round_trip(site: Site, side: str, body: dict[str, Any]) -> dict[str, Any]:
    """Create the Deployment, time apply -> first token, then delete it; the sample with what the pod reported."""
    name = body["metadata"]["name"]
    applied = time.monotonic()
    resource(site.client, "apps/v1", "Deployment").create(namespace=site.namespace, body=body)
    pod, answered = first_answer(site, name, PROMPT)
    sample: dict[str, Any] = {"side": side, "apply_to_first_token_s": answered - applied}
    if side == "s3-pull":
        log = pod_log(site.client, site.namespace, pod["metadata"]["name"], container="download")
        found = re.search(r"downloaded (\d+) bytes in ([\d.]+)s", log)
        if found:
            sample["download_bytes"], sample["download_s"] = int(found[1]), float(found[2])
    delete_deployment(site, name)
    return sample


def measure(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    model = make_model(work / "llama", MODEL_SHAPES[args.shape])
    model_bytes = sum(p.stat().st_size for p in model.iterdir())
    print(f"model: {args.shape}, {model_bytes / 1e6:.0f} MB", file=sys.stderr)
    with RealNode(node_images_archive()) as node:
        node.import_images(serving_image_archive())
        client = new_dynamic_client(str(node.kubeconfig))
        install_strata(node, client)
        with running_s3_server(host=NODE_IP) as s3:
            for namespace in pod_security_namespace(client, "restricted"):
                s3_secret(client, namespace, "s3-credentials", s3.access_key, s3.secret_key)

                def shared_pvc(cache: str, namespace: str = namespace) -> dict[str, Any]:
                    static_volume(client, namespace, f"{cache}-model", size="4Gi")
                    return {"size": "4Gi", "storageClassName": STATIC_CLASS}

                site = Site(client, namespace, s3.endpoint_url, "s3-credentials", shared_pvc, region=s3.region)
                uri = upload_model_dir(s3, model)
                started = time.monotonic()
                shared_cache_from_s3(site, "llama", uri)
                status = wait_phase(client, namespace, "llama", {"Ready", "Degraded", "Failed"}, timeout=1200)
                if status["phase"] != "Ready":
                    raise SystemExit(f"the cache did not become Ready: {status.get('conditions')}")
                preload = time.monotonic() - started
                print(f"ModelCache apply -> Ready (once): {preload:.1f}s", file=sys.stderr)
                samples: list[dict[str, Any]] = []
                for round_no in range(args.rounds):
                    for side in SIDES[round_no % 2 :] + SIDES[: round_no % 2]:
                        name = unique(side.split("-")[0])
                        if side == "strata-claim":
                            # The serving image carries Strata: the same start as before the webhook added
                            # packages (their copy and check would be time neither side needs here).
                            opt_out = {INJECT_ANNOTATION: "false"}
                            body = deployment(name, SERVING_IMAGE, "llama", None, opt_out)
                        else:
                            body = s3_pull_deployment(
                                name, SERVING_IMAGE, uri, s3.endpoint_url, "s3-credentials", s3.region
                            )
                        sample = round_trip(site, side, body) | {"round": round_no}
                        print(f"round {round_no + 1} {side}: {sample['apply_to_first_token_s']:.1f}s", file=sys.stderr)
                        samples.append(sample)
    return {"model_bytes": model_bytes, "preload_s": preload, "samples": samples}


def summary(result: dict[str, Any]) -> dict[str, Any]:
    rows = {}
    for side in SIDES:
        times = [s["apply_to_first_token_s"] for s in result["samples"] if s["side"] == side]
        rows[side] = {"median_s": statistics.median(times), "min_s": min(times), "max_s": max(times), "n": len(times)}
    downloads = [s for s in result["samples"] if "download_s" in s]
    if downloads:
        rows["s3-pull"]["download_median_s"] = statistics.median(s["download_s"] for s in downloads)
        rows["s3-pull"]["download_gb_per_s"] = statistics.median(
            s["download_bytes"] / s["download_s"] / 1e9 for s in downloads
        )
    ratio = rows["s3-pull"]["median_s"] / rows["strata-claim"]["median_s"]
    return {"rows": rows, "s3_pull_over_strata": ratio}


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["rows"]
    medians = [rows[s]["median_s"] for s in SIDES]
    low = [rows[s]["median_s"] - rows[s]["min_s"] for s in SIDES]
    high = [rows[s]["max_s"] - rows[s]["median_s"] for s in SIDES]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.bar(SIDES, medians, yerr=[low, high], capsize=4, color=["#2e7d32", "#999"])
    if "download_median_s" in rows["s3-pull"]:
        ax.bar(["s3-pull"], [rows["s3-pull"]["download_median_s"]], color="#666", label="of which the S3 download")
        ax.legend()
    for i, median in enumerate(medians):
        ax.annotate(f"{median:.1f}s", (i + 0.22, median), ha="left", va="bottom")
    ax.set_ylabel("kubectl apply -> first token (s), median and range")
    ax.set_title(f"vLLM (CPU) Deployment start, {result['model_bytes'] / 1e9:.2f} GB model, real node")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--shape", choices=sorted(MODEL_SHAPES), default="1g")
    parser.add_argument("--output", type=Path, default=REPO / "bench" / "results" / "serving_start")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="serving-start-") as tmp:
        measured = measure(args, Path(tmp))
    result = measured | summary(measured) | {"rounds": args.rounds, "shape": MODEL_SHAPES[args.shape]}
    args.output.mkdir(parents=True, exist_ok=True)
    (args.output / "result.json").write_text(json.dumps(result, indent=2))
    plot(result, args.output / "start.png")
    print(f"{'side':<14} {'apply -> first token':>21} {'range':>16}")
    for side, row in result["rows"].items():
        print(f"{side:<14} {row['median_s']:>20.1f}s {row['min_s']:>7.1f}-{row['max_s']:<7.1f}s")
    pull = result["rows"]["s3-pull"]
    if "download_median_s" in pull:
        print(f"s3-pull's download: {pull['download_median_s']:.1f}s median ({pull['download_gb_per_s']:.2f} GB/s)")
    print(f"s3-pull / strata-claim: {result['s3_pull_over_strata']:.2f}x; the cache's one preload took")
    print(f"{result['preload_s']:.1f}s; written to {args.output}")


if __name__ == "__main__":
    main()
