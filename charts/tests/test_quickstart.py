"""The README's quickstart, run as far as it can be without a cluster: every command in it is parsed and checked
against what it names (the samples it applies, the chart it installs, the images it builds, the CRDs its kubectl
commands read), so a rename, a changed flag or a moved file breaks this test rather than a newcomer's first hour.
The API server's own check of the manifests it applies is the integration test at the end. Also here: the chart's
NOTES, which `helm install` prints on the way."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from strata_operator.api.kvcachetier import KVCacheTierSpec
from strata_operator.api.modelcache import ModelCacheSpec
from strata_operator.conditions import CONDITION_TYPES
from strata_operator.webhook.vllm_command import vllm_form
from strata_testsupport.helm import CHART, REPO

README = REPO / "README.md"
CONTROL = ("&&", "||", ";", "|", "&")
STRATA_SPECS = {"ModelCache": ModelCacheSpec, "KVCacheTier": KVCacheTierSpec}
CORE_KINDS = {
    "Deployment": ("deployment", "deployments", "deploy"),
    "DaemonSet": ("daemonset", "daemonsets", "ds"),
    "Service": ("service", "services", "svc"),
    "Pod": ("pod", "pods", "po"),
    "Secret": ("secret", "secrets"),
    "ConfigMap": ("configmap", "configmaps", "cm"),
}
"""The core kinds the quickstart's manifests and kubectl commands may name, with the names kubectl takes."""
KUBECTL_FLAGS_WITH_VALUE = {"-n", "--namespace", "-f", "--filename", "-o", "--output", "-l", "--selector", "--for",
                            "--timeout", "-c", "--container"}  # fmt: skip


def section(text: str, title: str) -> str:
    """The body of the `## title` section."""
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", text, re.S | re.M)
    assert match, f"README.md has no '## {title}' section"
    return match.group(1)


def quickstart() -> str:
    return section(README.read_text(), "Quickstart")


def shell_lines(text: str) -> list[str]:
    """The quickstart's ```sh block as logical lines (continuations joined), and the kubectl commands its prose
    names in code spans, which a reader runs too."""
    blocks = re.findall(r"```sh\n(.*?)```", text, re.S)
    assert len(blocks) == 1, f"the quickstart should hold one ```sh block, it holds {len(blocks)}"
    lines = blocks[0].replace("\\\n", " ").splitlines()
    prose = re.sub(r"```.*?```", "", text, flags=re.S)
    spans = [" ".join(s.split()) for s in re.findall(r"`([^`]+)`", prose)]
    return lines + [s for s in spans if s.startswith("kubectl ") and len(s.split()) >= 3]


@dataclass
class Command:
    """One simple command as the shell runs it."""

    words: list[str]
    env: dict[str, str]
    background: bool = False
    piped_to: Command | None = None


def commands(lines: list[str]) -> list[Command]:
    """Simple commands, split at control operators; redirections dropped, `NAME=value` prefixes kept as env, and a
    command piped into another carries it (`piped_to`) rather than being listed."""
    found: list[Command] = []
    for line in lines:
        lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        tokens = list(lexer)
        while ">" in tokens:  # `> file`: the redirection and its target
            at = tokens.index(">")
            del tokens[at : at + 2]
        current: list[str] = []
        last: Command | None = None
        piped = False
        for token in [*tokens, ";"]:
            if token not in CONTROL:
                current.append(token)
                continue
            env = {}
            while current and re.match(r"^[A-Z_][A-Z0-9_]*=", current[0]):
                name, value = current.pop(0).split("=", 1)
                env[name] = value
            if current:
                command = Command(current, env, background=token == "&")
                if piped and last is not None:
                    last.piped_to = command
                else:
                    found.append(command)
                last = command
            current, piped = [], token == "|"
    return found


def expand(word: str, variables: dict[str, str]) -> str:
    def value(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        assert name in variables, f"the quickstart uses ${name} before it sets it"
        return variables[name]

    return re.sub(r"\$\{(\w+)\}|\$([A-Za-z_]\w*)", value, word)


def crd_kinds() -> dict[str, dict[str, Any]]:
    """Every name kubectl takes for one of Strata's kinds (plural, singular, short names), to its CRD."""
    kinds = {}
    for path in sorted((REPO / "crds").glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        names = crd["spec"]["names"]
        for name in (names["plural"], names["singular"], names["kind"].lower(), *names.get("shortNames", [])):
            kinds[name] = crd
    return kinds


def walk_schema(schema: dict[str, Any], path: str, where: str) -> None:
    """Each field of a JSONPath like `.status.nodes[*].phase` exists in the CRD's schema."""
    node = schema
    for part in re.findall(r"\.([A-Za-z0-9_]+)(\[[^\]]*\])?", path):
        name, index = part
        if node.get("x-kubernetes-preserve-unknown-fields") and not node.get("properties"):
            return
        properties = node.get("properties") or {}
        assert name in properties, f"{where}: {path} names {name!r}, which the CRD's schema does not have"
        node = properties[name]
        if index:
            assert node.get("type") == "array", f"{where}: {path} indexes {name!r}, which is not a list"
            node = node["items"]


def check_jsonpath(template: str, crd: dict[str, Any], where: str) -> None:
    """kubectl's JSONPath template (`{.a.b}{"\\n"}`, `{range .x[*]}...{end}`) against the CRD's schema."""
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    bases: list[str] = [""]
    for expression in re.findall(r"\{([^{}]*)\}", template):
        expression = expression.strip()
        if expression.startswith('"') or expression == "end":
            if expression == "end":
                bases.pop()
            continue
        if expression.startswith("range "):
            bases.append(bases[-1] + expression.removeprefix("range ").strip())
            continue
        assert expression.startswith("."), f"{where}: {expression!r} is no JSONPath this test reads"
        if expression.startswith(".metadata."):
            continue
        walk_schema(schema, bases[-1] + expression, where)


@dataclass
class Cluster:
    """What the quickstart has built, pushed, installed and applied so far, as each later command needs it."""

    helm: Any
    tmp: Path
    variables: dict[str, str] = field(default_factory=dict)
    built: set[str] = field(default_factory=set)
    pushed: set[str] = field(default_factory=set)
    serving_images: set[str] = field(default_factory=set)
    csi_drivers: set[str] = field(default_factory=set)
    objects: dict[tuple[str, str, str], dict[str, Any]] = field(default_factory=dict)
    forwarded: dict[int, dict[str, Any]] = field(default_factory=dict)
    background: bool = False
    answered: list[tuple[str, str]] = field(default_factory=list)
    restarted_since_answer: set[str] = field(default_factory=set)

    def find(self, kind: str, name: str, namespace: str) -> dict[str, Any]:
        found = self.objects.get((kind, namespace, name))
        assert found is not None, f"the quickstart uses {kind} {namespace}/{name} before anything creates it"
        return found


def resolve_kind(name: str) -> tuple[str, dict[str, Any] | None]:
    """(kind, its CRD or None for a core kind) of a resource name kubectl takes."""
    for kind, names in CORE_KINDS.items():
        if name.lower() in names:
            return kind, None
    crd = crd_kinds().get(name.lower())
    assert crd is not None, f"kubectl knows no resource {name!r}: neither a core kind nor in crds/"
    return crd["spec"]["names"]["kind"], crd


def run_make_images(command: Command, cluster: Cluster) -> None:
    """`make images` with a docker that records what it is asked to build: the image names and tags
    images/build.sh really makes from the quickstart's IMAGE_PREFIX."""
    assert command.words[1:] == ["images"], command.words
    docker = cluster.tmp / "docker"
    log = cluster.tmp / "docker.log"
    docker.write_text(f'#!/bin/sh\necho "$@" >> {log}\n')
    docker.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("IMAGE_TAG", "IMAGE_PREFIX", "KIND_CLUSTER")}
    env |= {k: expand(v, cluster.variables) for k, v in command.env.items()} | {"DOCKER": str(docker)}
    subprocess.run(["make", "-s", "-C", str(REPO), "images"], env=env, check=True, capture_output=True, timeout=60)
    for line in log.read_text().splitlines():
        words = line.split()
        if words[:1] == ["build"]:
            cluster.built.add(words[words.index("--tag") + 1])


def run_docker(words: list[str], cluster: Cluster) -> None:
    if words[1] == "push":
        (ref,) = words[2:]
        assert ref in cluster.built, f"docker push {ref}: nothing before it builds that image (built: {cluster.built})"
        cluster.pushed.add(ref)
        return
    assert words[1] == "build", words
    dockerfile = words[words.index("-f") + 1]
    assert (REPO / dockerfile).is_file(), f"docker build -f {dockerfile}: no such file"
    assert words[-1] == ".", "the Dockerfiles build from the repository root (their COPY paths are relative to it)"
    ref = words[words.index("-t") + 1]
    cluster.built.add(ref)
    if dockerfile == "images/vllm-cpu/Dockerfile":
        cluster.serving_images.add(ref)


def run_helm(words: list[str], cluster: Cluster) -> None:
    """`helm install` rendered by the real Helm CLI with the same release, namespace and values; `helm template`
    also at the oldest Kubernetes the quickstart names."""
    assert words[1] == "install", f"the quickstart runs `helm {words[1]}`, which this test does not check"
    release, chart = words[2], words[3]
    assert (REPO / chart).resolve() == CHART, f"helm install {chart}: the chart is {CHART.relative_to(REPO)}"
    flags = words[4:]
    namespace = flags[flags.index("--namespace") + 1] if "--namespace" in flags else "default"
    sets = [flags[i + 1] for i, flag in enumerate(flags) if flag == "--set"]
    args = ["template", release, str(CHART), "--namespace", namespace, *(a for s in sets for a in ("--set", s))]
    minimum = re.search(r"Kubernetes\s+(\d+\.\d+) or newer", quickstart())
    assert minimum, "the quickstart names the oldest Kubernetes it runs on"
    cluster.helm.run(*args, "--kube-version", f"v{minimum.group(1)}.0")
    objects = [o for o in yaml.safe_load_all(cluster.helm.run(*args).stdout) if o]
    for obj in objects:
        cluster.objects[(obj["kind"], obj["metadata"].get("namespace", namespace), obj["metadata"]["name"])] = obj
    chart_version = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    (operator,) = [o for o in objects if o["kind"] == "Deployment"]
    (container,) = operator["spec"]["template"]["spec"]["containers"]
    assert container["image"] in cluster.pushed, f"the operator runs {container['image']}, which was not pushed"
    assert container["image"].endswith(f":{chart_version}")
    runtime = {e["name"]: e.get("value") for e in container["env"]}["STRATA_RUNTIME_IMAGE"]
    assert runtime in cluster.pushed, f"preload Jobs and KV servers would run {runtime}, which was not pushed"
    cluster.csi_drivers |= {o["metadata"]["name"] for o in objects if o["kind"] == "CSIDriver"}


def apply_file(path: str, namespace: str, cluster: Cluster) -> None:
    assert path.startswith("samples/"), f"kubectl apply -f {path}: the quickstart applies samples/ (tested there)"
    assert (REPO / path).is_file(), f"kubectl apply -f {path}: no such file"
    for doc in yaml.safe_load_all((REPO / path).read_text()):
        if not doc:
            continue
        kind = doc["kind"]
        resolve_kind(kind)
        if kind in STRATA_SPECS:
            STRATA_SPECS[kind].model_validate(doc["spec"])
        if kind == "KVCacheTier" and doc["spec"].get("nodeSocket", {}).get("enabled"):
            driver = doc["spec"]["nodeSocket"].get("driver", "kv.strata.dev")
            assert driver in cluster.csi_drivers, (
                f"{path}: the tier's node socket needs the CSIDriver {driver}, which the helm install does not render"
            )
        cluster.objects[(kind, doc["metadata"].get("namespace", namespace), doc["metadata"]["name"])] = doc


def serving_container(deployment: dict[str, Any], cluster: Cluster) -> dict[str, Any]:
    """The Deployment's vLLM container, checked to be wired by its labels alone and runnable in its image."""
    template = deployment["spec"]["template"]
    labels, namespace = template["metadata"]["labels"], deployment["metadata"].get("namespace", "default")
    cluster.find("ModelCache", labels["strata.dev/model-cache"], namespace)
    cluster.find("KVCacheTier", labels["strata.dev/kv-cache-tier"], namespace)
    (vllm,) = [c for c in template["spec"]["containers"] if vllm_form(c)]
    if vllm["image"] in cluster.serving_images:  # vllm-cpu's `vllm` command cannot run `serve`
        assert vllm_form(vllm) == "module", "the CPU serving image runs python3 -m vllm.entrypoints.openai.api_server"
    return vllm


def flag(container: dict[str, Any], name: str) -> str | None:
    args = [str(a) for a in container.get("args") or []]
    return args[args.index(name) + 1] if name in args else None


def kubectl_args(words: list[str]) -> tuple[list[str], dict[str, list[str]]]:
    """kubectl's words after the program: (positional arguments, flags with their values)."""
    positional: list[str] = []
    options: dict[str, list[str]] = {}
    at = 0
    while at < len(words):
        word = words[at]
        if word.startswith("--") and "=" in word:
            key, value = word.split("=", 1)
            options.setdefault(key, []).append(value)
        elif word in KUBECTL_FLAGS_WITH_VALUE:
            options.setdefault(word, []).append(words[at + 1])
            at += 1
        elif word.startswith("-"):
            options.setdefault(word, []).append("")
        else:
            positional.append(word)
        at += 1
    return positional, options


def check_pod_selector(target: str, selector: str, cluster: Cluster) -> None:
    """`kubectl get pod -l k=v`: some Deployment the quickstart applies makes pods with that label."""
    resolve_kind(target)
    assert selector, f"kubectl get {target} names no object"
    key, value = selector.split("=")
    templates = [o["spec"]["template"] for (kind, _, _), o in cluster.objects.items() if kind == "Deployment"]
    labels = [t.get("metadata", {}).get("labels", {}) for t in templates]
    assert any(found.get(key) == value for found in labels), f"kubectl get {target} -l {selector}: no such pods"


def run_kubectl(command: Command, cluster: Cluster) -> None:
    (verb, *args), options = kubectl_args(command.words[1:])
    namespace = (options.get("-n") or options.get("--namespace") or ["default"])[0]
    if verb == "apply":
        for path in options["-f"]:
            apply_file(path, namespace, cluster)
        return
    if verb in ("set", "rollout"):  # `set image`, `rollout status|restart`: the object follows
        what, *args = args
        assert what in ("image", "status", "restart"), f"`kubectl {verb} {what}` is not checked here"
    if verb == "get" and "/" not in args[0] and len(args) == 1:
        check_pod_selector(args[0], options.get("-l", [""])[0], cluster)
        return
    resource_name, name = args.pop(0).split("/", 1) if "/" in args[0] else (args.pop(0), args.pop(0))
    kind, crd = resolve_kind(resource_name)
    obj = cluster.find(kind, name, namespace)
    if verb == "wait":
        condition = options["--for"][0].removeprefix("condition=")
        assert condition in CONDITION_TYPES.get(kind, ()), f"kubectl wait: {kind} has no condition {condition!r}"
    elif verb == "get":
        for output in options.get("-o", []):
            if output.startswith("jsonpath="):
                assert crd is not None, "a JSONPath on a core kind cannot be checked here"
                check_jsonpath(output.removeprefix("jsonpath="), crd, " ".join(command.words))
    elif verb == "set":
        container_name, image = args[0].split("=", 1)
        containers = {c["name"]: c for c in obj["spec"]["template"]["spec"]["containers"]}
        assert container_name in containers, f"kubectl set image: {name} has no container {container_name!r}"
        assert image in cluster.pushed, f"kubectl set image: {image} was not pushed"
        containers[container_name]["image"] = image
    elif verb == "rollout" and what == "restart":
        cluster.restarted_since_answer.add(name)
    elif verb == "port-forward":
        local, remote = (int(p) for p in args[0].split(":"))
        assert kind == "Service", "the quickstart reaches the engine through its Service"
        assert remote in [p["port"] for p in obj["spec"]["ports"]], f"Service {name} has no port {remote}"
        assert command.background, "port-forward runs in the background, so the next command can use it"
        cluster.background = True
        cluster.forwarded[local] = obj
    elif verb != "rollout":
        pytest.fail(f"the quickstart runs `kubectl {verb}`, which this test does not check")


def run_curl(command: Command, cluster: Cluster) -> None:
    """A completion through the forwarded Service: the request file asks the served model for a prompt long enough
    to leave whole chunks in the tier, and the engine reports cached tokens."""
    words = command.words
    url = next(w for w in words[1:] if "localhost" in w)
    port, path = re.match(r"(?:http://)?localhost:(\d+)(/.*)", url).groups()  # type: ignore[union-attr]
    assert int(port) in cluster.forwarded, f"curl {url}: nothing forwards port {port}"
    assert path == "/v1/completions", path
    body_file = words[words.index("-d") + 1].removeprefix("@")
    body = json.loads((REPO / body_file).read_text())
    service = cluster.forwarded[int(port)]
    namespace = service["metadata"].get("namespace", "default")
    selector = service["spec"]["selector"]
    (deployment,) = [
        o
        for (kind, ns, _), o in cluster.objects.items()
        if kind == "Deployment" and ns == namespace and o["spec"]["selector"]["matchLabels"] == selector
    ]
    vllm = serving_container(deployment, cluster)
    assert body["model"] == flag(vllm, "--served-model-name"), "the request names another model than vLLM serves"
    assert "--enable-prompt-tokens-details" in vllm["args"], "without it vLLM reports no cached_tokens"
    tier = cluster.find("KVCacheTier", deployment["spec"]["template"]["metadata"]["labels"]["strata.dev/kv-cache-tier"],
                        namespace)  # fmt: skip
    chunk_tokens = KVCacheTierSpec.model_validate(tier["spec"]).chunk_tokens
    words_in_prompt = len(body["prompt"].split())  # a Llama tokenizer gives a word one token or more
    assert words_in_prompt >= 2 * chunk_tokens, f"{words_in_prompt} words fill no two chunks of {chunk_tokens} tokens"
    max_len = int(flag(vllm, "--max-model-len") or 0)
    assert 2 * words_in_prompt + body["max_tokens"] <= max_len, "the prompt may not fit --max-model-len"
    assert command.piped_to is None or command.piped_to.words == ["jq", ".usage"], command.piped_to
    cluster.answered.append((deployment["metadata"]["name"], body_file))
    if len(cluster.answered) > 1:
        assert cluster.answered[-1] == cluster.answered[0], "the second request repeats the first"
        assert deployment["metadata"]["name"] in cluster.restarted_since_answer, (
            "between the two requests a fresh engine must start, or the cached tokens come from vLLM's own "
            "prefix cache rather than from Strata's tier"
        )
    cluster.restarted_since_answer.clear()


def run_quickstart(helm: Any, tmp: Path) -> Cluster:
    cluster = Cluster(helm, tmp)
    for command in commands(shell_lines(quickstart())):
        command.words = [command.words[0], *(expand(w, cluster.variables) for w in command.words[1:])]
        program = command.words[0]
        if program == "export":
            for assignment in command.words[1:]:
                name, value = assignment.split("=", 1)
                cluster.variables[name] = value
        elif program == "make":
            run_make_images(command, cluster)
        elif program == "docker":
            run_docker(command.words, cluster)
        elif program == "helm":
            run_helm(command.words, cluster)
        elif program == "kubectl":
            run_kubectl(command, cluster)
        elif program == "curl":
            run_curl(command, cluster)
        elif program == "kill":
            assert command.words[1:] == ["$!"] and cluster.background, "kill $! ends the port-forward started before"
            cluster.background = False
        elif program != "sleep":
            pytest.fail(f"the quickstart runs `{program}`, which this test does not check")
    return cluster


def test_the_quickstart_is_short():
    body = quickstart().strip().splitlines()
    assert len(body) <= 40, f"the quickstart has {len(body)} lines: keep it to about 40, move the rest to docs/"


def test_every_quickstart_command_runs_against_what_it_names(helm, tmp_path):
    cluster = run_quickstart(helm, tmp_path)
    assert len(cluster.answered) == 2, "the quickstart asks for a completion twice"
    assert "usage.prompt_tokens_details.cached_tokens" in quickstart(), "the prose says where the cached tokens show"
    assert not cluster.background, "every port-forward the quickstart starts, it ends"


def test_commands_are_split_as_the_shell_splits_them():
    """The parser the test above relies on, on the forms the quickstart uses."""
    lines = ["kubectl port-forward svc/x 8000:8000 >/dev/null & sleep 3", "curl a | jq .b", "kill $!  # done"]
    forward, sleep, curl, kill = commands(lines)
    assert forward.words == ["kubectl", "port-forward", "svc/x", "8000:8000"] and forward.background
    assert sleep.words == ["sleep", "3"] and not sleep.background
    assert curl.words == ["curl", "a"] and curl.piped_to is not None and curl.piped_to.words == ["jq", ".b"]
    assert kill.words == ["kill", "$!"]
    (made,) = commands(["IMAGE_PREFIX=$R/ make images   # a comment"])
    assert made.env == {"IMAGE_PREFIX": "$R/"} and made.words == ["make", "images"]
    assert expand("$R/x:${T}", {"R": "reg", "T": "1"}) == "reg/x:1"
    with pytest.raises(AssertionError, match=r"\$UNSET"):
        expand("$UNSET/x", {})


def test_a_jsonpath_naming_a_field_the_crd_lacks_is_caught():
    crd = crd_kinds()["modelcache"]
    check_jsonpath('{.status.resolvedRevision}{"\\n"}{range .status.nodes[*]}{.phase}{end}', crd, "ok")
    with pytest.raises(AssertionError, match="resolvedRevisions"):
        check_jsonpath("{.status.resolvedRevisions}", crd, "typo")


RENDER_NOTES = """apiVersion: v1
kind: ConfigMap
metadata:
  name: notes
data:
  NOTES.txt: {{ include "strata/templates/NOTES.txt" . | quote }}
"""
"""A template that renders the chart's own NOTES.txt (Helm names it so) into an object `helm template` prints:
`helm install --dry-run` prints NOTES too, but only with a cluster to reach."""


def notes(helm: Any, tmp: Path, *values: str) -> str:
    """The chart's NOTES.txt as `helm install` prints it after installing, rendered by the real Helm CLI."""
    chart = tmp / "strata"
    if not chart.exists():
        shutil.copytree(CHART, chart)  # links followed: the copy holds the CRDs themselves
        (chart / "templates" / "render-notes.yaml").write_text(RENDER_NOTES)
    out = helm.run("template", "strata", str(chart), "--show-only", "templates/render-notes.yaml", *values).stdout
    return str(yaml.safe_load(out)["data"]["NOTES.txt"])


def test_notes_show_the_label_way_and_never_paste_status_volume(helm, tmp_path):
    shown = notes(helm, tmp_path)
    assert "strata.dev/model-cache: <ModelCache name>" in shown
    assert "strata.dev/kv-cache-tier: <KVCacheTier name>" in shown
    assert "status.volume" not in shown, "with the webhook on, nothing is pasted from status.volume"
    by_hand = notes(helm, tmp_path, "--set", "webhook.enabled=false")
    assert "status.volume" in by_hand and "strata.dev/model-cache" not in by_hand, "without the webhook: by hand"


def quickstart_files() -> list[str]:
    """The manifests the quickstart applies (none if it cannot be read: the tests above say why)."""
    try:
        found = commands(shell_lines(quickstart()))
    except AssertionError:
        return []
    applied = [c.words for c in found if c.words[:2] == ["kubectl", "apply"]]
    return sorted({words[i + 1] for words in applied for i, word in enumerate(words[:-1]) if word == "-f"})


QUICKSTART_FILES = quickstart_files()


def cpu_cores(quantity: str) -> float:
    return int(quantity[:-1]) / 1000 if quantity.endswith("m") else float(quantity)


def test_the_node_the_quickstart_asks_for_holds_what_it_runs():
    """The engine and the node's KV server run side by side: the node the prose asks for must fit both requests."""
    from strata_operator.resources.kvcachetier.children import build_children
    from strata_operator.resources.kvcachetier.names import TierRef
    from strata_operator.resources.runtime_image import RuntimeImage, release_image
    from strata_units import parse_bytes

    asked = re.search(r"a node with (\d+) CPUs and (\d+) GiB of memory free", " ".join(quickstart().split()))
    assert asked, "the quickstart says what node it needs"
    templates = []
    for path in QUICKSTART_FILES:
        for doc in yaml.safe_load_all((REPO / path).read_text()):
            if doc and doc["kind"] == "Deployment":
                templates.append(doc["spec"]["template"])
            elif doc and doc["kind"] == "KVCacheTier":
                spec = KVCacheTierSpec.model_validate(doc["spec"])
                children = build_children(spec, TierRef("kv", "ns", "uid", 1), RuntimeImage(release_image()))
                templates.append(children.daemonset["spec"]["template"])
    requests = [c.get("resources", {}).get("requests", {}) for t in templates for c in t["spec"]["containers"]]
    cpus = sum(cpu_cores(str(r.get("cpu", "0"))) for r in requests)
    memory = sum(parse_bytes(str(r.get("memory", "0")), minimum=0) for r in requests)
    assert cpus <= int(asked.group(1)), f"the quickstart's pods ask for {cpus} CPUs"
    assert memory <= int(asked.group(2)) << 30, f"the quickstart's pods ask for {memory / 2**30:.1f} GiB"


def test_the_api_server_check_covers_every_file_the_quickstart_applies():
    assert QUICKSTART_FILES, "the quickstart applies no manifest: the parser lost them"
    for path in QUICKSTART_FILES:
        assert (REPO / path).is_file(), path


@pytest.mark.integration
@pytest.mark.parametrize("path", QUICKSTART_FILES)
def test_the_quickstarts_manifests_are_accepted_by_the_api_server(k8s, strata_crds, namespace, path):
    """Schema, CEL rules and defaults are the API server's own (a server-side dry run stores nothing)."""
    from strata_testsupport.kube import resource

    for doc in yaml.safe_load_all((REPO / path).read_text()):
        if doc:
            resource(k8s, doc["apiVersion"], doc["kind"]).create(body=doc, namespace=namespace, dry_run="All")
