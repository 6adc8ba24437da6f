"""Every rendered manifest validates against the Kubernetes 1.30 schemas (KubeRay CRDs: structure + their
embedded pod templates). Renders with `kubectl kustomize` when available, else loads each kustomization's
plain resource files (no patches) with a minimal loader."""

import shutil
import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

MANIFESTS = Path(__file__).resolve().parents[2] / "manifests"
K8S_VERSION = "1.30.0"
KUBECTL = shutil.which("kubectl")


def load_resources(kustomization_dir: Path) -> list[dict]:
    """Minimal loader: follows `resources` (files and directories); ignores patches and generators."""
    k = yaml.safe_load((kustomization_dir / "kustomization.yaml").read_text())
    docs: list[dict] = []
    for entry in k.get("resources", []):
        path = kustomization_dir / entry
        if path.is_dir():
            docs += load_resources(path)
        else:
            docs += [d for d in yaml.safe_load_all(path.read_text()) if d]
    return docs


def render(kustomization_dir: Path) -> list[dict]:
    if KUBECTL is None:
        return load_resources(kustomization_dir)
    proc = subprocess.run(
        [KUBECTL, "kustomize", str(kustomization_dir)], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


def validate_pod_template(template: dict, where: str) -> None:
    kubernetes_validate.validate(
        {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "t"}, "template": template},
        K8S_VERSION,
        strict=True,
    )


def validate_doc(doc: dict) -> None:
    where = f"{doc.get('kind')}/{doc.get('metadata', {}).get('name')}"
    if doc.get("apiVersion", "").startswith("ray.io/"):
        spec = doc["spec"]
        assert doc["apiVersion"] == "ray.io/v1", where
        if doc["kind"] == "RayCluster":
            validate_pod_template(spec["headGroupSpec"]["template"], where)
            for group in spec["workerGroupSpecs"]:
                assert group["minReplicas"] <= group["replicas"] <= group["maxReplicas"], where
                validate_pod_template(group["template"], where)
        elif doc["kind"] == "RayJob":
            assert spec["entrypoint"].strip() and ("clusterSelector" in spec or "rayClusterSpec" in spec), (
                where
            )
        else:
            raise AssertionError(f"unexpected ray.io kind {where}")
        return
    kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def by_kind(docs: list[dict]) -> dict[tuple[str, str], dict]:
    return {(d["kind"], d["metadata"]["name"]): d for d in docs}


def check_all(docs: list[dict]) -> None:
    assert docs
    for doc in docs:
        try:
            validate_doc(doc)
        except kubernetes_validate.ValidationError as e:
            raise AssertionError(
                f"{doc['kind']}/{doc['metadata']['name']}: {e.message} at {'.'.join(map(str, e.path))}"
            ) from None


def test_base_renders_and_validates():
    docs = render(MANIFESTS / "base")
    check_all(docs)
    kinds = by_kind(docs)
    launcher = kinds[("ConfigMap", "kfp-launcher")]
    assert launcher["data"]["defaultPipelineRoot"] == "minio://harnessrl/pipeline-root"
    vllm = kinds[("Deployment", "vllm")]["spec"]["template"]["spec"]
    limits = vllm["containers"][0]["resources"]["limits"]
    assert limits["nvidia.com/gpu"] == "1"
    assert vllm["tolerations"][0]["key"] == "nvidia.com/gpu"
    rbac = kinds[("RoleBinding", "harnessrl-sandbox-launcher")]
    assert rbac["subjects"][0] == {
        "kind": "ServiceAccount",
        "name": "pipeline-runner",
        "namespace": "kubeflow",
    }
    role = kinds[("Role", "harnessrl-sandbox-launcher")]
    assert {"create", "delete"} <= set(next(r for r in role["rules"] if "pods" in r["resources"])["verbs"])
    assert "create" in next(r for r in role["rules"] if "pods/exec" in r["resources"])["verbs"]
    ray = kinds[("RayCluster", "harnessrl-ray")]
    worker = ray["spec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]
    assert worker["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert not any(d["kind"] == "Secret" for d in docs), "base must not ship credentials"


def test_secret_template_is_a_valid_secret_without_values():
    (doc,) = list(yaml.safe_load_all((MANIFESTS / "base" / "s3-secret.template.yaml").read_text()))
    kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    assert set(doc["stringData"]) == {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"}
    assert not any(doc["stringData"].values())
    base_files = yaml.safe_load((MANIFESTS / "base" / "kustomization.yaml").read_text())["resources"]
    assert "s3-secret.template.yaml" not in base_files


def test_secret_and_store_names_match_the_pipeline_code():
    from pipelines.k8s import S3_SECRET_KEYS, S3_SECRET_NAME, STORE_CONFIG_KEYS, STORE_CONFIG_MAP

    docs = by_kind(render(MANIFESTS / "base"))
    store = docs[("ConfigMap", STORE_CONFIG_MAP)]
    assert set(STORE_CONFIG_KEYS) <= set(store["data"])
    template = yaml.safe_load((MANIFESTS / "base" / "s3-secret.template.yaml").read_text())
    assert template["metadata"]["name"] == S3_SECRET_NAME and set(S3_SECRET_KEYS) <= set(
        template["stringData"]
    )


@pytest.mark.skipif(KUBECTL is None, reason="overlays use patches: rendering them needs kubectl kustomize")
@pytest.mark.parametrize("overlay", ["local-kind", "production"])
def test_overlays_render_and_validate(overlay):
    docs = render(MANIFESTS / "overlays" / overlay)
    check_all(docs)
    kinds = by_kind(docs)
    if overlay == "local-kind":
        assert ("Deployment", "vllm") not in kinds
        assert kinds[("Secret", "harnessrl-s3")]["metadata"]["namespace"] == "kubeflow"
        assert kinds[("RayCluster", "harnessrl-ray")]["spec"]["workerGroupSpecs"][0]["replicas"] == 0
    else:
        assert kinds[("ConfigMap", "kfp-launcher")]["data"]["defaultPipelineRoot"].startswith("s3://")
        providers = yaml.safe_load(kinds[("ConfigMap", "kfp-launcher")]["data"]["providers"])
        assert providers["s3"]["default"]["credentials"]["secretRef"]["secretName"] == "harnessrl-s3"
        assert ("Job", "harnessrl-create-bucket") not in kinds
        assert not any(d["kind"] == "Secret" for d in docs)
        assert kinds[("Deployment", "vllm")]["spec"]["replicas"] == 4
    namespaces = {d["metadata"].get("namespace") for d in docs if d["kind"] in ("Role", "RoleBinding")}
    assert "harnessrl-sandbox" in namespaces
    assert any(d["kind"] == "Namespace" and d["metadata"]["name"] == "harnessrl-sandbox" for d in docs), (
        "the sandbox namespace the RBAC points at must be created by manifests/sandbox"
    )


def test_root_kustomization_includes_base_and_sandbox():
    k = yaml.safe_load((MANIFESTS / "kustomization.yaml").read_text())
    assert k["resources"] == ["base", "sandbox"]
