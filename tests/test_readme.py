"""The README's curl walkthrough works verbatim against a running server, and its error
list names every code a client can get for a conflict, a body or invalid input."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import app.main  # noqa: F401  (registers every route and so every error class)
from app.core.errors import ServiceError
from tests.test_cli import serve_on_a_free_port, wait_for_port

ROOT = Path(__file__).resolve().parents[1]


def walkthrough() -> str:
    text = (ROOT / "README.md").read_text()
    section = text.split("## Walkthrough with curl", 1)[1]
    match = re.search(r"```bash\n(.*?)```", section, re.S)
    assert match, "no bash block in the walkthrough section"
    return match.group(1)


@pytest.mark.slow
def test_walkthrough_runs_verbatim(tmp_path: Path) -> None:
    # A scratch checkout: the examples, and a .venv whose activate puts this interpreter first.
    work = tmp_path / "checkout"
    (work / ".venv" / "bin").mkdir(parents=True)
    (work / "app").mkdir()
    (work / "app" / "demo").symlink_to(ROOT / "app" / "demo")
    bin_dir = Path(sys.executable).parent
    (work / ".venv" / "bin" / "activate").write_text(f'export PATH="{bin_dir}:$PATH"\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith("CURATOR_")}
    env |= {"CURATOR_DATA_DIR": str(tmp_path / "data")}
    env["PATH"] = f"{bin_dir}:{env['PATH']}"
    port_file = tmp_path / "port"
    server = subprocess.Popen(
        serve_on_a_free_port(port_file),
        env=env,
        cwd=tmp_path,  # not the scratch checkout: its app/ would shadow the installed package
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        port = wait_for_port(server, port_file)
        env["CURATOR_URL"] = f"http://127.0.0.1:{port}"
        result = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", walkthrough()],
            env=env,
            cwd=work,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.strip().splitlines()
    assert lines[0].startswith("dataset ")
    assert lines[1] == "404"
    assert lines[2] == "569"
    budget = json.loads(lines[3])
    assert budget["epsilon_total"] == 5.0
    assert budget["epsilon_remaining"] == 5.0
    assert "predicted_stderr" in lines[4]  # the preview's accuracy
    assert lines[5].startswith("release ")
    assert lines[5].endswith(": succeeded")
    assert lines[6].startswith("release ")
    assert lines[6].endswith(": succeeded")
    assert lines[7].startswith('"mean_radius","mean_texture"')
    assert "'stderr'" in lines[8]
    assert "'interval'" in lines[8]
    assert "'value'" in lines[9]
    assert lines[10] == "2.0"  # two releases of epsilon 1 spent; the retry-safe key charged once


def _error_classes(base: type[ServiceError]) -> list[type[ServiceError]]:
    return [base, *(c for sub in base.__subclasses__() for c in _error_classes(sub))]


def test_the_error_list_names_every_client_error_code() -> None:
    text = (ROOT / "README.md").read_text()
    errors = text.split("## HTTP API (v1)", 1)[1].split("| method and path |", 1)[0]
    codes = {c.code for c in _error_classes(ServiceError) if c.status_code in (409, 413, 415, 422)}
    codes.add("validation_error")  # the handler's code for a body or parameter that fails its type
    for code in sorted(codes):
        assert f"`{code}`" in errors, code


def test_the_readme_states_the_rule_on_declared_names_and_categories() -> None:
    """The schema section states the characters the code refuses, as the code has them."""
    from app.core.types import CONTROL_CATEGORIES, HIDDEN_FORMAT_CHARACTERS
    from app.datasets.schemas import FORMULA_CALLS, FORMULA_TRIGGERS

    text = " ".join((ROOT / "README.md").read_text().split())
    section = text.split("The schema of a table:", 1)[1].split("A graph:", 1)[0]
    controls = re.search(r"Unicode categories (.*?):", section)
    assert controls, "no control-character rule in the schema section"
    assert set(re.findall(r"\b(C[cf]|Z[lp])\b", controls.group(1))) == CONTROL_CATEGORIES
    for low, high in HIDDEN_FORMAT_CHARACTERS:
        named = f"U+{low:04X}" if low == high else f"U+{low:04X}-U+{high:04X}"
        assert named in section, named
    rule = re.search(r"and does not start with (.*?) while it holds (.*?) \(a function", section)
    assert rule, "no formula rule in the schema section"
    assert tuple(re.findall(r"`(.)`", rule.group(1))) == FORMULA_TRIGGERS[1:]
    assert tuple(re.findall(r"`(.)`", rule.group(2))) == FORMULA_CALLS
    assert f"does not start with `{FORMULA_TRIGGERS[0]}`" in section
    assert "unless it is a plain number" in section
    assert "a dataset declared before it keeps its names and categories" in section
