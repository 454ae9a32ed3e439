"""The report (HTML, Markdown, JSON) from constructed runs: content, self-containment,
escaping, the advisor at the top, atomic writes and the CLI's errors."""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser
from pathlib import Path

import pytest

from sextant.cli import main
from sextant.core.errors import UserError
from sextant.report import build_report, load_advice, render, render_html, write_report
from sextant.results.store import ResultsStore
from sextant.report.html import html_from_report
from sextant.report.markdown import markdown_from_report
from tests.report.runs import (
    calibrated_machine,
    compare_group,
    make_run,
    with_fingerprint,
)

REPO = Path(__file__).resolve().parents[2]
PROFILE = REPO / "examples" / "profiles" / "startup-nvidia-pytorch.toml"
EVIL = '<script>alert(1)</script>"\'&<img src=x onerror=alert(2)>'


class _Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.style = ""
        self._in_style = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))
        self._in_style = tag == "style"

    def handle_endtag(self, tag: str) -> None:
        self._in_style = False

    def handle_data(self, data: str) -> None:
        if self._in_style:
            self.style += data


def assert_self_contained(page: str) -> None:
    """Nothing the browser would fetch or run: parsed tags and attributes, inline CSS."""
    parser = _Tags()
    parser.feed(page)
    names = {t for t, _ in parser.tags}
    assert not names & {"script", "link", "iframe", "object", "embed", "img", "image", "use",
                        "video", "audio", "source", "base", "form", "meta http-equiv"}, names
    for tag, attrs in parser.tags:
        for name, value in attrs.items():
            assert not name.startswith("on"), (tag, name)
            if name in ("src", "srcset", "action", "data", "poster", "xlink:href", "href",
                        "background", "ping"):
                assert tag == "a" and name == "href" and (value or "").startswith("#"), (
                    tag, name, value)
            assert "url(" not in (value or ""), (tag, name, value)
        assert not (tag == "meta" and "http-equiv" in attrs), attrs
    css = parser.style + "".join(a.get("style") or "" for _, a in parser.tags)
    assert "url(" not in css and "@import" not in css and "@font-face" not in css


def test_model_has_every_section() -> None:
    report = build_report(compare_group())
    assert set(report) >= {"recommendation", "summary", "claims", "runs", "scaling", "memory",
                           "communication", "parity", "compile", "environment", "workload"}
    s = report["summary"]
    assert s["fastest"]["run"] == "jax compiled" and s["parity_ok"] and s["runs"] == 5
    assert s["fastest"]["speedup_vs_reference"] == pytest.approx(0.20 / 0.08)
    assert report["recommendation"] == {
        "source": "measured",
        "hint": "sextant report --profile examples/profiles/startup-nvidia-pytorch.toml"}
    # Scaling: per framework, one worker then two.
    series = {x["name"]: [(p["workers"], round(p["speedup_vs_one"], 3)) for p in x["points"]]
              for x in report["scaling"]["series"]}
    assert series == {"torch dp": [(1, 1.0), (2, round(0.20 / 0.12, 3))],
                      "jax dp (compiled)": [(1, 1.0), (2, round(0.08 / 0.30, 3))]}
    assert report["scaling"]["prediction"] is None
    # Communication: compute = synced step - exposed communication.
    comm = {c["run"]: c for c in report["communication"]}
    assert comm["torch dp x2"]["compute_s"] == pytest.approx(0.10)
    assert comm["jax compiled dp x2"]["exposed_comm_s"] == pytest.approx(0.2)
    # Memory: one row per rank, start + growth = peak.
    ranks = report["memory"]["ranks"]
    assert len(ranks) == 7
    assert all(r["rss_start_bytes"] + r["growth_bytes"] == r["peak_rss_bytes"] for r in ranks)
    assert report["memory"]["model_state_bytes"] == 16 * 136960
    # Compile: first step vs steady.
    compiled = {c["run"]: c for c in report["compile"]}
    assert compiled["jax compiled"]["compile_s"] == pytest.approx(15.0 - 0.08)
    # Throughput spread comes from the step-time p90 (low) and p10 (high).
    t = report["runs"][0]["tokens_per_s"]
    assert t["low"] < t["median"] < t["high"]
    assert report["environment"]["framework_versions"] == {"torch": "2.4", "jax": "0.5"}


def test_html_shows_sections_and_is_self_contained() -> None:
    page = render_html(compare_group())
    assert_self_contained(page)
    for text in ("Measured on this machine", "jax compiled is fastest here",
                 "sextant report --profile examples/profiles/startup-nvidia-pytorch.toml",
                 "Claims check", "torch.compile gives a 10-30% speed-up", "holds",
                 "not measured", "Throughput and step time", "Scaling with workers",
                 "Communication vs compute", "Memory per rank", "identical data flow",
                 "Compile time", "Environment", "Test CPU"):
        assert text in page, text
    assert page.count("<svg") == 6  # throughput, scaling, comm, memory, loss, compile


def test_html_flags_runs_that_did_not_train_the_same_thing() -> None:
    runs = compare_group()
    runs[2] = runs[2].replace(losses=(5.5, 4.5, 3.5))
    page = render_html(runs)
    assert "losses disagree" in page and "did not train the same thing" in page
    assert "identical data flow" not in page


def test_user_strings_are_escaped_in_every_format() -> None:
    # A run's label is its strategy's, from a fixed vocabulary; the workload and the machine
    # are the user's strings.
    runs = [with_fingerprint(run.replace(workload={**run.workload, "name": EVIL,
                                                   "description": EVIL}), cpu=EVIL)
            for run in compare_group()]
    page = render(runs, "html")
    assert "<script>alert" not in page and "<img src=x" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert_self_contained(page)
    md = render(runs, "md")
    assert not re.search(r"(?<!\\)<", md), "an unescaped < would start raw HTML"
    assert json.loads(render(runs, "json"))["workload"]["name"] == EVIL


def test_legacy_minimal_record_renders() -> None:
    """A record with only what the store's own test writes (no spreads, no rank data)."""
    from tests.test_store import record

    rec = record().replace(created_at="2026-11-30T00:00:00", id=1, ranks=())
    for fmt in ("html", "md", "json"):
        assert render([rec], fmt)


def test_markdown_has_the_same_sections() -> None:
    md = render(compare_group(), "md")
    for heading in ("## Recommendation", "## Claims check", "## Throughput and step time",
                    "## Scaling with workers", "## Communication vs compute",
                    "## Memory per rank", "## Loss parity", "## Compile time",
                    "## Environment"):
        assert heading in md, heading
    assert "| torch.compile gives a 10-30% speed-up |" in md
    assert "**Verdict: identical data flow**" in md


def test_json_is_the_model() -> None:
    runs = compare_group()
    data = json.loads(render(runs, "json"))
    model = build_report(runs)
    data.pop("generated_at"), model.pop("generated_at")
    assert data == json.loads(json.dumps(model))


def test_unknown_format_names_the_allowed_ones() -> None:
    with pytest.raises(UserError, match="allowed: html, md, json"):
        render(compare_group(), "pdf")


def test_profile_puts_the_recommendation_on_top() -> None:
    runs = compare_group()
    advice = load_advice(PROFILE, runs)
    page = render_html(runs, advice=advice, profile_path=str(PROFILE))
    assert_self_contained(page)
    top = advice.ranking[0].candidate
    head = page[:page.index('id="claims"')]
    assert "Recommended stack" in head and f'<div class="big">{top}</div>' in head
    assert "Measured on this machine" not in head and "Full advice" in page
    md = render(runs, "md", advice=advice, profile_path=str(PROFILE))
    assert f"**Recommended stack: {top}**" in md
    data = json.loads(render(runs, "json", advice=advice, profile_path=str(PROFILE)))
    assert data["recommendation"]["top"] == top and data["recommendation"]["advice"]["ranking"]
    # CPU runs are no evidence for an NVIDIA team: shown, not scored, and the page says so.
    evidence = data["recommendation"]["advice"]["evidence"]
    assert not any(x["source"] == "measured" for x in evidence)
    assert any("not your target (nvidia)" in n for n in data["recommendation"]["notes"])
    # Measured on the target's hardware, they enter as evidence.
    runs = [run.with_metrics(device="gpu", accelerator="NVIDIA H200") for run in runs]
    gpu_advice = load_advice(PROFILE, runs)
    assert any(e.source == "measured" for e in gpu_advice.evidence)


def test_profile_name_is_escaped(tmp_path: Path) -> None:
    profile = tmp_path / "p.toml"
    text = PROFILE.read_text()
    profile.write_text(re.sub(r'^name = .*$', 'name = "<b>evil</b>"', text, flags=re.M))
    runs = compare_group()
    page = render_html(runs, advice=load_advice(profile, runs), profile_path=str(profile))
    assert "<b>evil</b>" not in page and "&lt;b&gt;evil&lt;/b&gt;" in page


@pytest.fixture
def store_db(tmp_path: Path) -> Path:
    db = tmp_path / "results" / "results.db"
    with ResultsStore(db) as store:
        for run in compare_group():
            store.add(run)
        store.add(make_run(step=0.5).replace(group_id="g2"))
    return db


def test_write_report_latest_group_all_formats_atomically(store_db: Path) -> None:
    with ResultsStore(store_db) as store:
        out = write_report(store, store_db.parent / "report.html")
        assert "1 runs" in out.read_text()  # g2 is the latest group
        out = write_report(store, store_db.parent / "report.html", group_id="g1")
        assert "5 runs" in out.read_text()
        for fmt in ("md", "json"):
            write_report(store, store_db.parent / f"r.{fmt}", group_id="g1", fmt=fmt)
        assert json.loads((store_db.parent / "r.json").read_text())["summary"]["runs"] == 5
        with pytest.raises(UserError, match="allowed: html, md, json"):
            write_report(store, store_db.parent / "r.pdf", fmt="pdf")
        with pytest.raises(UserError, match="no runs of group 'nope'"):
            write_report(store, store_db.parent / "r.html", group_id="nope")
    leftovers = [p.name for p in store_db.parent.iterdir() if p.name.endswith(".tmp")]
    assert not leftovers and not (store_db.parent / "r.pdf").exists()


def test_cli_formats_out_and_profile(store_db: Path, tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", "--db", str(store_db), "--group", "g1"]) == 0
    assert (store_db.parent / "report.html").is_file()
    assert main(["report", "--db", str(store_db), "--group", "g1", "--format", "md"]) == 0
    assert (store_db.parent / "report.md").read_text().startswith("# sextant report")
    capsys.readouterr()
    assert main(["report", "--db", str(store_db), "--group", "g1", "--format", "json",
                 "--out", "-", "--profile", str(PROFILE)]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["recommendation"]["source"] == "advisor"
    out = tmp_path / "sub" / "page.html"
    assert main(["report", "--db", str(store_db), "--out", str(out)]) == 0 and out.is_file()


@pytest.mark.parametrize("args, message", [
    (["--format", "pdf"], "unknown --format 'pdf'; allowed: html, md, json"),
    (["--profile", "no-such.toml"], "--profile no-such.toml: no such file"),
    (["--group", "nope"], "no runs of group 'nope'"),
])
def test_cli_bad_input_is_one_line(store_db: Path, capsys: pytest.CaptureFixture[str],
                                   args: list[str], message: str) -> None:
    assert main(["report", "--db", str(store_db), *args]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_cli_missing_store(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", "--db", str(tmp_path / "none.db")]) == 2
    err = capsys.readouterr().err
    assert "no results store at" in err and err.count("\n") == 1
    assert not (tmp_path / "none.db").exists()


def test_bf16_runs_are_drawn_but_not_held_to_fp32_parity() -> None:
    runs = compare_group() + [make_run(step=0.1, precision="bf16", losses=[5.6, 4.2, 3.3])]
    report = build_report(runs)
    assert report["parity"]["ok"] and "not held to parity" in report["parity"]["note"]
    assert [p["held_to_parity"] for p in report["parity"]["per_run"]][-1] is False
    assert len(report["parity"]["curves"]) == 6


def test_scaling_chart_draws_the_planner_prediction(tmp_path: Path) -> None:
    report = build_report(compare_group(), machine=calibrated_machine(tmp_path, cores=4))
    torch_dp = next(x for x in report["scaling"]["series"] if x["name"] == "torch dp")
    assert [q["workers"] for q in torch_dp["prediction"]["points"]] == [1, 2, 4]
    one, two = torch_dp["points"]
    # The compute efficiency is fitted on the one-worker run: that point agrees exactly;
    # the two-worker point is a prediction, and its error against the measurement is shown.
    assert one["predicted_tokens_per_s"] == pytest.approx(one["tokens_per_s"], rel=1e-9)
    assert two["prediction_error"] == pytest.approx(
        two["predicted_tokens_per_s"] / two["tokens_per_s"] - 1)
    assert report["scaling"]["prediction"]["series_predicted"] == 2
    page = html_from_report(report)
    assert "torch dp, planner" in page and "Dotted lines: the planner" in page
    assert "Predicted, not measured, on this machine" in page  # 4 workers: beyond the runs
    text = markdown_from_report(report)
    assert "| planner error |" in text and "tokens/s (planner)" in text


def test_scaling_without_calibration_says_how_to_get_the_prediction() -> None:
    report = build_report(compare_group())
    assert report["scaling"]["prediction"] is None
    assert "sextant calibrate" in report["scaling"]["prediction_note"]
    assert all("prediction" not in x for x in report["scaling"]["series"])


def test_recommendation_takes_training_hours_from_a_plan(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--model", "llama2-7b", "--accelerator", "h100-sxm", "--gpus", "16",
                 "--tokens", "1.4e11", "--no-curve", "--json"]) == 0
    plan = tmp_path / "plan.json"
    plan.write_text(capsys.readouterr().out)
    tps = json.loads(plan.read_text())["throughput"]["tokens_per_s"]
    runs = compare_group()
    rec = build_report(runs, advice=load_advice(PROFILE, runs, plan),
                       profile_path=str(PROFILE))["recommendation"]
    assert rec["hours_source"].startswith("planner: llama2-7b on 16 x h100-sxm")
    assert rec["training_hours"] == pytest.approx(1.4e11 / tps / 3600)
    rec = build_report(runs, advice=load_advice(PROFILE, runs))["recommendation"]
    assert rec["hours_source"].startswith("rule of thumb: 6 x")


def test_an_incomplete_calibration_never_breaks_the_report(tmp_path: Path) -> None:
    from sextant.planner.local import load_machine

    path = tmp_path / "calibration.json"  # what calibrate writes without torch: no all-reduce
    path.write_text(json.dumps({"schema": 1, "host": {"cores": 2}, "allreduce": None,
                                "gemm": {}, "memory_bw_bytes_per_s": 1e10}))
    report = build_report(compare_group(), machine=load_machine(path))
    assert report["scaling"]["prediction"]["series_predicted"] == 0
    assert report["scaling"]["prediction_note"].startswith("The planner could not predict")
    assert "<svg" in html_from_report(report)
