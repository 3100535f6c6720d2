"""The reference tables in docs/ are the code's own words (vllm_fleet/docgen): a table that differs
from the code, a table the code offers that no page shows, or a key without a description fails
here, naming the table and the command that fixes it."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from prometheus_client import Counter

import fleet_supervisor.metrics
from fleet_supervisor.metrics import FleetMetrics
from fleetspec.fleetfile import SupervisorSection
from gateway.settings import GatewaySettings
from vllm_fleet.docgen import blocks, sources
from vllm_fleet.docgen.__main__ import main as docgen

ROOT = Path(__file__).resolve().parents[1]
FIX = f"run `{blocks.COMMAND}` from the repository root"


def test_every_generated_table_matches_the_code() -> None:
    stale = blocks.stale_blocks(ROOT, sources.render)
    assert not stale, "\n".join(s.message(ROOT) for s in stale)


def test_every_table_the_code_offers_is_in_some_page() -> None:
    used = blocks.names_in_docs(ROOT)
    missing = [n for n in sources.all_names() if n not in used]
    assert not missing, (f"no page shows {missing}: add `<!-- generated:NAME -->` + `<!-- /generated -->` where "
                         f"each belongs, then {FIX}")


def test_every_key_and_variable_has_a_description() -> None:
    missing = sources.undescribed()
    assert not missing, f"give these fields Field(description=...): {missing}"


def test_every_metric_is_explained_for_operators() -> None:
    """metrics.md says what each metric means beyond its help text, outside the generated tables."""
    text = (ROOT / "docs" / "metrics.md").read_text(encoding="utf-8")
    prose = re.sub(r"<!-- generated:.*?<!-- /generated -->", "", text, flags=re.S)
    names = re.findall(r"^\| `(fleet_\w+)`", text, flags=re.M)
    assert len(names) >= 10
    unexplained = [n for n in names if f"`{n}`" not in prose]
    assert not unexplained, f"docs/metrics.md: say what these mean for an operator: {unexplained}"


def test_docgen_check_passes_on_the_repository(capsys: pytest.CaptureFixture[str]) -> None:
    assert docgen(["--root", str(ROOT)]) == 0, capsys.readouterr().err


def test_docgen_imports_nothing_of_the_gateway_or_supervisor_until_it_renders() -> None:
    code = "import sys, vllm_fleet.docgen.__main__; print(sorted(m for m in sys.modules if m.split('.')[0] in " \
           "('gateway', 'fleet_supervisor', 'fleetspec', 'vllm_fleet') and not m.startswith('vllm_fleet')))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", out


# -- the check can fail: drift in a copy of the docs --------------------------------------------


@pytest.fixture
def docs_copy(tmp_path: Path) -> Path:
    """A repository root holding one page with the supervisor table, freshly generated."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "page.md").write_text(
        "# Page\n\nProse stays.\n\n<!-- generated:fleet-file:supervisor -->\n<!-- /generated -->\n\nMore prose.\n",
        encoding="utf-8")
    blocks.write_blocks(tmp_path, sources.render)
    assert blocks.stale_blocks(tmp_path, sources.render) == []
    return tmp_path


def test_a_changed_default_fails_the_check_naming_table_and_command(docs_copy: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(SupervisorSection.model_fields["stop_grace_s"], "default", 45.0)
    stale = blocks.stale_blocks(docs_copy, sources.render)
    assert [s.block.name for s in stale] == ["fleet-file:supervisor"]
    message = stale[0].message(docs_copy)
    assert "docs/page.md:5" in message and "'fleet-file:supervisor'" in message and blocks.COMMAND in message
    assert "| `supervisor.stop_grace_s` | number, ≥ 0 | `45` |" in stale[0].expected


def test_write_fixes_drift_and_keeps_the_prose(docs_copy: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(SupervisorSection.model_fields["stop_grace_s"], "description", "changed words")
    blocks.write_blocks(docs_copy, sources.render)
    text = (docs_copy / "docs" / "page.md").read_text(encoding="utf-8")
    assert "changed words" in text and "Prose stays." in text and text.endswith("More prose.\n")
    assert blocks.stale_blocks(docs_copy, sources.render) == []
    assert blocks.write_blocks(docs_copy, sources.render) == []  # a second write changes nothing


def test_a_new_setting_default_reaches_the_settings_table(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(GatewaySettings.model_fields["queue_timeout_s"], "default", 12.5)
    assert "| `FLEET_QUEUE_TIMEOUT_S` | `12.5` |" in sources.render("gateway-settings")


def test_a_new_metric_reaches_the_metrics_table_without_touching_docgen(monkeypatch: pytest.MonkeyPatch) -> None:
    class WithOneMore(FleetMetrics):
        def __init__(self, names: list[str]) -> None:
            super().__init__(names)
            self.extra = Counter("fleet_extra_total", "One more, added by another engineer", ["why"],
                                 registry=self.registry)

    monkeypatch.setattr(fleet_supervisor.metrics, "FleetMetrics", WithOneMore)
    assert "| `fleet_extra_total` | counter | `why` | One more, added by another engineer |" in \
        sources.render("metrics:supervisor")


def test_a_missing_end_marker_is_an_error_not_a_silent_rewrite(tmp_path: Path) -> None:
    text = "<!-- generated:gateway-settings -->\nold\n"
    with pytest.raises(blocks.BlockError, match=r"page.md:1: .* has no <!-- /generated -->"):
        list(blocks.blocks(text, "page.md"))


def test_an_unknown_table_name_lists_the_known_ones() -> None:
    with pytest.raises(sources.UnknownTable, match="fleet-file:supervisor"):
        sources.render("fleet-file:supervisr")
