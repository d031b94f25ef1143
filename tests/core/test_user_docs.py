"""What a new user reads: a license, the prerequisites and costs of the setup, an explained clone
address and real image tags, and documents that speak of the project (not of who wrote it)."""
import os
import re

from tests_support import REPO


def _read(rel):
    with open(os.path.join(REPO, rel)) as f:
        return f.read()


def _prose(text):
    """Markdown without fenced code blocks and inline code."""
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    return re.sub(r"`[^`]*`", "", text)


def test_apache_license():
    text = _read("LICENSE")
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION" in text and "END OF TERMS" in text
    assert 'license = {text = "Apache-2.0"}' in _read("pyproject.toml")


def test_readme_states_prerequisites_and_costs():
    readme = _read("README.md")
    for needle in ("PyPI", "https://download.pytorch.org/whl/cpu", "Debian", "2 GB of disk",
                   "minutes on 2 CPU cores", "SM12X_SETUP_DOCKER=1", "--version"):
        assert needle in readme, needle
    assert "about 200 MB;" not in readme  # the download, not the environment


def test_readme_clone_address_and_image_tags():
    readme = _read("README.md")
    assert "git clone <this repo>" not in readme
    clone = next(x for x in readme.splitlines() if x.startswith("git clone"))
    assert "#" in clone  # the placeholder is explained on its line
    assert "vllm/vllm-openai:v0.34.0" in readme and "lmsysorg/sglang:v0.5.23" in readme
    assert "vllm/vllm-openai:TAG" not in readme


def test_documents_speak_of_the_project():
    first_person = re.compile(r"\b(I|we|We|our|Our|us)\b")
    for rel in ("README.md", "docker/README.md"):
        found = [line for line in _prose(_read(rel)).splitlines() if first_person.search(line)]
        assert not found, (rel, found)
    docker = _read("docker/README.md")
    assert "hermia" not in docker and "I chose" not in docker
