"""Render RELIABILITY.md from the results the reliability tests recorded.

The promises in RELIABILITY.md (fuzzed inputs, injected faults, hostile rig values) must be what the test
suite actually did on its last run, not prose: `tests/reliability/conftest.py` writes
`tests/reliability/.results.json` after a run, and this script turns it into the Markdown table.

    python -m pytest tests/reliability -n 2 && python tools/reliability_report.py
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "tests" / "reliability" / ".results.json"
OUTPUT = ROOT / "RELIABILITY.md"

AREAS = {
    "fuzz": "Fuzzed inputs",
    "injection": "Hostile rig-file values (injection)",
    "fault": "Faults injected on test hosts",
    "trust": "Trust: host keys and secrets",
}
RESULT_WORDS = {"passed": "pass", "failed": "**FAIL**", "skipped": "skipped", "known bug": "known bug"}

INTRO = """\
# Reliability and security

What the reliability tests (`tests/reliability/`) tried on their last run and how each ended. This page is
generated: run `python -m pytest tests/reliability -n 2` (add `MGPU_SLOW=1` for the long fuzz runs), then
`python tools/reliability_report.py`. Test hosts are real OpenSSH servers on loopback, each in its own mount
and UTS namespace, with a simulated NVIDIA layer (see `tests/support/hosts.py`).
"""


def figures_text(figures: dict[str, Any]) -> str:
    return ", ".join(
        f"{key} {value:,}" if isinstance(value, int) else f"{key} {value}" for key, value in figures.items()
    )


def cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def result_text(trial: dict[str, Any]) -> str:
    words = RESULT_WORDS.get(trial["outcome"], trial["outcome"])
    reason = trial.get("reason")
    return f"{words}: {reason}" if reason and trial["outcome"] != "passed" else words


def render(results: dict[str, Any]) -> str:
    """The whole Markdown page for one recorded run."""
    trials: list[dict[str, Any]] = results["trials"]
    counts: dict[str, int] = {}
    for trial in trials:
        counts[trial["outcome"]] = counts.get(trial["outcome"], 0) + 1
    examples = sum(int(t.get("figures", {}).get("examples", 0)) for t in trials if t.get("area") == "fuzz")
    lines = [
        INTRO,
        f"Last run: {results['finished']}, Python {results['python']}, "
        f"{results['workers']} pytest worker(s), "
        + (
            "long fuzz runs included."
            if results["slow"]
            else "long fuzz runs not included (MGPU_SLOW unset)."
        ),
        "",
        "Totals: "
        + ", ".join(f"{n} {outcome}" for outcome, n in sorted(counts.items()))
        + f"; {examples:,} fuzzed inputs in all.",
        "",
    ]
    for area, title in AREAS.items():
        rows = [t for t in trials if t.get("area") == area]
        if not rows:
            continue
        lines += [
            f"## {title}",
            "",
            "| What was tried | Figures | Must end in | Result | Seconds |",
            "|---|---|---|---|---|",
        ]
        for trial in rows:
            lines.append(
                "| "
                + " | ".join(
                    cell(str(part))
                    for part in (
                        trial.get("tried", trial["nodeid"]),
                        figures_text(trial.get("figures", {})),
                        trial.get("expect", ""),
                        result_text(trial),
                        trial.get("seconds", ""),
                    )
                )
                + " |"
            )
        lines.append("")
    # Tests skipped before they ran (the long runs without MGPU_SLOW) never described themselves.
    unlabelled = [t for t in trials if t.get("area") not in AREAS]
    if unlabelled:
        lines += ["## Not run or not described", ""]
        lines += [f"- `{t['nodeid']}`: {result_text(t)}" for t in unlabelled]
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument("--output", type=Path, default=OUTPUT)
    args = parser.parse_args(argv)
    try:
        results = json.loads(args.results.read_text())
    except FileNotFoundError:
        print(
            f"error: {args.results} not found: run `python -m pytest tests/reliability` first",
            file=sys.stderr,
        )
        return 1
    args.output.write_text(render(results))
    print(f"wrote {args.output} ({len(results['trials'])} trials)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
