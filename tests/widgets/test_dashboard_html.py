"""widgets/dashboard_html.py on view documents written by hand: the DOM the live view draws,
the CSS inlined, no script, every text escaped, long names clipped, folded rows summed.
"""

from __future__ import annotations

from netq.widgets.dashboard_html import FRONTEND, render_html

SPARK = {"series": [[0, 50, None, 100]], "max": "1.0 KiB/s", "size": 4}
BUDGET = {"text": "1 B of 2 B", "fraction": 0.5, "high": False}


def view(**fields) -> dict:
    document = {
        "live": False, "state": "snapshot", "state_label": "snapshot",
        "facts": ["1 communicator (1 open)"], "clock": "sampled 12:00:00",
        "snapshot": "snapshot taken 12:00:00, not live", "empty": "",
        "map": {"nodes": [{"name": "server", "x": 2, "y": 8, "state": "open",
                           "detail": "open · TCP", "outside": False}], "edges": []},
        "communicators": [{
            "name": "server", "role": "server", "uptime": "1 s", "transport": "TCP",
            "address": "127.0.0.1:1", "state": "open", "state_label": "open", "note": "",
            "peers": 1, "in_rate": "1 B/s", "in_msgs": "1 msg/s", "out_rate": "0 B/s",
            "out_msgs": "0 msg/s", "spark": SPARK, "received": BUDGET, "memory": BUDGET}],
        "communicators_more": None, "links": [], "links_more": None, "credit_note": "",
        "stalls": {"active": [], "active_more": 0, "ended": []},
    }
    document.update(fields)
    return document


def test_a_snapshot_in_the_live_views_dom_with_its_css_and_no_script():
    page = render_html(view())
    assert page.startswith("<style>")
    assert (FRONTEND / "dashboard.css").read_text(encoding="utf-8") in page
    assert 'class="netq-view netq-dashboard" data-live="0"' in page
    assert 'class="netq-badge" data-state="snapshot"' in page
    assert 'tr class="netq-communicator" data-name="server"' in page
    assert 'class="netq-map"' in page and 'class="netq-sparkline"' in page
    assert "No links yet." in page and "No waits" in page
    assert "<script" not in page


def test_an_empty_kernel_says_so_and_draws_no_table():
    page = render_html(view(empty="No communicator in this kernel yet"))
    assert "No communicator in this kernel yet" in page and "<table" not in page


def test_texts_are_escaped_long_names_clipped_and_folded_rows_summed():
    row = {"key": "a→b", "a": "<a>", "b": "worker-with-a-very-long-name-number-07",
           "outside": True, "state": "connected", "waiting": True, "reason": "no <credit>",
           "waited": "2 s", "forward_rate": "1 B/s", "forward_msgs": "1 msg/s",
           "forward_total": "1 msgs", "back_rate": "0 B/s", "back_msgs": "0 msg/s",
           "back_total": "0 msgs", "queued": "0 / 0", "credit_forward": "-1 B",
           "credit_back": "-", "credit_negative": True, "spark_rate": SPARK,
           "spark_queued": SPARK}
    more = {"count": 3, "forward_rate": "9 B/s", "back_rate": "0 B/s", "queued": "0 / 0",
            "waiting": 1}
    page = render_html(view(links=[row], links_more=more, credit_note="credit may dip"))
    assert "&lt;a&gt;" in page and "no &lt;credit&gt;" in page and "<credit>" not in page
    assert "worker-with-a-very…number-07" in page  # its start and end kept, 28 characters
    assert "(other process)" in page and 'data-waiting="1"' in page
    assert page.count('<tr class="netq-others"') == 1 and "+3 more links (1 waiting)" in page
    assert "* credit may dip" in page
