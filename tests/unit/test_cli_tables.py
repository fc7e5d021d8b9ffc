"""The CLI's tables (rich's Table as plain text): what a pipe or a test reads of them."""

from __future__ import annotations

from roq.cli.common import table


def test_columns_are_as_wide_as_their_widest_cell_and_numbers_can_align_right():
    text = table(("QUEUE", "LAG", "HOST"), [("q1", 5, "h1"), ("a-long-queue", 12345, "h2 (down)")],
                 right=("LAG",))  # fmt: skip
    assert text.splitlines() == [
        "QUEUE           LAG  HOST",
        "q1                5  h1",
        "a-long-queue  12345  h2 (down)",
    ]


def test_a_long_row_is_not_wrapped_and_no_cell_is_read_as_markup():
    long = "tcp://127.0.0.1:5100/" + "x" * 300
    text = table(("NAME", "ADDRESS"), [("[bold]q1[/bold]", long)], header=False, indent=2)
    assert text == f"  [bold]q1[/bold]  {long}"
    assert "\x1b" not in text  # no colour codes, tty or not
