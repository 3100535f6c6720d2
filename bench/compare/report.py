"""Derived numbers (added vs direct, ratios vs vllm-router, the issue's targets) and the markdown table."""

from __future__ import annotations

from typing import Any

ADDED = (("p50_ms_1", "added_p50_ms_1"), ("p99_ms_1", "added_p99_ms_1"), ("p50_ms_64", "added_p50_ms_64"),
         ("p99_ms_64", "added_p99_ms_64"), ("ttft_p50_ms", "added_ttft_p50_ms"),
         ("ttft_p99_ms", "added_ttft_p99_ms"), ("itl_p50_ms", "added_itl_p50_ms"),
         ("itl_p99_ms", "added_itl_p99_ms"))
CPU = ("cpu_us_per_request_64", "cpu_us_per_event_burst64", "cpu_us_per_event_paced256")


def derive(res: dict[str, Any]) -> None:
    t = res["targets"]
    direct = t.get("direct", {})
    router = t.get("vllm-router", {})
    for name, row in t.items():
        if name == "direct" or "unavailable" in row:
            continue
        for src, dst in ADDED:
            if row.get(src) is not None and direct.get(src) is not None:
                row[dst] = round(row[src] - direct[src], 3)
        for k in CPU:
            if row.get(k) and router.get(k):
                row[f"{k}_vs_router"] = round(row[k] / router[k], 2)
    gw, lite = t.get("gateway", {}), t.get("litellm", {})
    if "unavailable" in gw or not gw:
        return
    checks: dict[str, Any] = {}
    for k in ("cpu_us_per_event_paced256", "cpu_us_per_event_burst64", "cpu_us_per_request_64"):
        if gw.get(f"{k}_vs_router") is not None:
            checks[f"{k} <= 1.5x vllm-router"] = gw[f"{k}_vs_router"] <= 1.5
        if gw.get(k) and lite.get(k):
            ratio = round(lite[k] / gw[k], 1)
            checks[f"{k}: litellm / gateway >= 20"] = f"{ratio} ({'yes' if ratio >= 20 else 'NO'})"
    if gw.get("added_p50_ms_1") is not None and router.get("added_p50_ms_1") is not None:
        checks["added p50 (1 at a time) <= vllm-router's + 0.2 ms"] = \
            gw["added_p50_ms_1"] <= router["added_p50_ms_1"] + 0.2
    if gw.get("added_ttft_p99_ms") is not None:
        checks["added TTFT p99, 256 paced streams <= 2 ms"] = gw["added_ttft_p99_ms"] <= 2.0
    res["issue_targets"] = checks


ROWS = (
    ("p50 latency, 1 at a time (ms)", "p50_ms_1", 2),
    ("  added p50, 1 at a time (ms)", "added_p50_ms_1", 2),
    ("  added p99, 1 at a time (ms)", "added_p99_ms_1", 2),
    ("p50 latency, 64 concurrent (ms)", "p50_ms_64", 2),
    ("  added p50, 64 concurrent (ms)", "added_p50_ms_64", 2),
    ("  added p99, 64 concurrent (ms)", "added_p99_ms_64", 2),
    ("requests/s, 64 concurrent", "rps_64", 0),
    ("**CPU µs per request, 64 concurrent**", "cpu_us_per_request_64", 0),
    ("  × vllm-router", "cpu_us_per_request_64_vs_router", 2),
    ("CPU µs per SSE event, 64 streams back to back", "cpu_us_per_event_burst64", 1),
    ("  × vllm-router", "cpu_us_per_event_burst64_vs_router", 2),
    ("**CPU µs per SSE event, 256 paced streams**", "cpu_us_per_event_paced256", 1),
    ("  × vllm-router", "cpu_us_per_event_paced256_vs_router", 2),
    ("proxy core busy, paced (fraction)", "proxy_cpu_frac_paced", 2),
    ("paced events/s delivered", "paced_events_per_s", 0),
    ("TTFT p50, paced (ms)", "ttft_p50_ms", 2),
    ("  added TTFT p50 (ms)", "added_ttft_p50_ms", 2),
    ("  added TTFT p99 (ms)", "added_ttft_p99_ms", 2),
    ("inter-token p50, paced (ms)", "itl_p50_ms", 2),
    ("  added inter-token p50 (ms)", "added_itl_p50_ms", 2),
    ("  added inter-token p99 (ms)", "added_itl_p99_ms", 2),
    ("CPU 1 busy (upstream+loadgen), conc", "cpu1_busy_conc", 2),
    ("CPU 1 busy (upstream+loadgen), paced", "cpu1_busy_paced", 2),
    ("other processes' CPU, conc (cores)", "other_cpu_conc", 2),
    ("other processes' CPU, paced (cores)", "other_cpu_paced", 2),
    ("errors", "errors", 0),
)


def _fmt(v: Any, digits: int) -> str:
    if v is None:
        return "–"
    if isinstance(v, bool):
        return "yes" if v else "NO"
    if isinstance(v, float):
        return f"{v:,.{digits}f}"
    return str(v)


def markdown(res: dict[str, Any]) -> str:
    t = res["targets"]
    names = list(t)
    live = [n for n in names if "unavailable" not in t[n]]
    p = res["params"]
    out = [f"Paced: {p['paced_streams']} streams × {p['paced_tokens']} tokens, {p['token_ms']:g} ms apart "
           f"({p['rounds']} rounds; LiteLLM: at most 2 rounds, half the tokens, a tenth of the other counts). "
           f"Proxy on CPU 0, upstream + load generator on CPU 1. Run took {res.get('wall_s')} s. "
           f"Other processes used {res['host'].get('other_cpu_before_cores')} cores before the start.", "",
           "| metric | " + " | ".join(live) + " |", "|---|" + "---|" * len(live)]
    for label, key, digits in ROWS:
        out.append(f"| {label} | " + " | ".join(_fmt(t[n].get(key), digits) for n in live) + " |")
    out.append("| version | " + " | ".join(str(t[n].get("version", "")) for n in live) + " |")
    for n in names:
        if "unavailable" in t[n]:
            out.append(f"\n**{n}: unavailable:** {t[n]['unavailable']}")
        elif t[n].get("timed_out") or t[n].get("first_error"):
            out.append(f"\n{n}: timed out in {t[n].get('timed_out', [])}; first error: {t[n].get('first_error', '')}")
    if res.get("issue_targets"):
        out += ["", "Issue #5 targets (gateway):", ""]
        out += [f"- {k}: {_fmt(v, 1)}" for k, v in res["issue_targets"].items()]
    return "\n".join(out) + "\n"
