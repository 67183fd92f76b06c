"""The live board in a real browser: Playwright drives Debian's chromium (/usr/bin/chromium, never a
downloaded browser). The board is open; a team submits through the CLI; its row appears and its points
change on the open page, without a reload; then a team submits through the page's upload form; all of it
under the server's Content-Security-Policy, which the browser enforces; the organiser freezes the board and
applies a rejudging, and the open page says so and marks the row. At the close the open board drops
its upload form and shows the seed, without a reload; on a phone's screen it is laid out at the phone's
width."""
from __future__ import annotations

import sqlite3
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from arena_support import SCORE, Server, add_teams, create, http, solution, token_option, tree
from graders.frame.catalogue import REPO_ROOT

CHROMIUM = Path("/usr/bin/chromium")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]

pytestmark = pytest.mark.timeout(900)


def browser_missing() -> str | None:
    if not CHROMIUM.exists():
        return f"Debian's chromium is missing: {CHROMIUM} does not exist (`apt-get install -y chromium`; .ci/run installs it)"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "the playwright package is missing (`uv sync` installs the dev group)"
    return None


def test_the_board_moves_in_a_real_browser(tmp_path):
    missing = browser_missing()
    if missing:
        pytest.skip(missing)
    from playwright.sync_api import expect, sync_playwright

    db = f"sqlite:///{tmp_path / 'arena.db'}"
    organiser = create(db, "--kata", "01_linear_relu", "--no-speed", "--rate", "5/600")
    orbit, form_team = add_teams(db, "Orbit", "Form <Team>")
    server = Server(db, tmp_path)
    cli = None
    pool = ThreadPoolExecutor(1)
    starting = pool.submit(server.start)  # the server starts while chromium does (seconds each)
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch_persistent_context(
                str(tmp_path / "profile"), executable_path=str(CHROMIUM), headless=True, args=FLAGS)
            try:
                starting.result()
                page = browser.new_page()
                console = []  # a script or style the policy refused would be said here
                page.on("console", lambda message: console.append(message.text))
                page.goto(server.url + "/")
                expect(page.locator("#board")).to_be_visible()
                assert page.locator("tr[data-team='Orbit']").count() == 0
                page.evaluate("window.notReloaded = true")

                cli = subprocess.Popen([sys.executable, SCORE, "--submit", server.url, token_option(orbit), "--solutions",
                                        str(tree(tmp_path / "orbit", {"01_linear_relu/solution.py": solution("01_linear_relu")}))],
                                       cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                row = page.locator("tr[data-team='Orbit']")
                try:
                    expect(row).to_have_count(1, timeout=60_000)  # the row appears as soon as it is acknowledged
                except AssertionError as failure:  # say what the submitting client and the server saw
                    if cli.poll() is None:
                        cli.kill()
                    raise AssertionError(f"{failure}\nscore.py --submit (exit {cli.wait()}) said:\n{cli.stdout.read()}\n"
                                         f"the server's log ends:\n{server.log.read_text()[-3000:]}") from None
                print(f"row appeared: {row.inner_text()!r}")
                expect(row.locator("td").nth(2)).to_have_text("80.0", timeout=600_000)  # its points change
                print(f"row after grading: {row.inner_text()!r}")
                assert page.evaluate("window.notReloaded") is True  # the same page: no reload
                output, _ = cli.communicate(timeout=120)
                print(output)
                assert cli.returncode == 0 and "rank 1 of 1" in output

                upload = tmp_path / "upload.py"
                upload.write_bytes(solution("01_linear_relu", "through the form"))
                page.fill("input[name='token']", form_team)
                page.set_input_files("input[name='01_linear_relu/solution.py']", str(upload))
                page.click("#upload button[type='submit']")
                page.wait_for_url("**/submissions/2", timeout=60_000)
                expect(page.locator("h1")).to_have_text("Submission #2")
                expect(page.locator("#status")).to_have_text("graded", timeout=600_000)  # the page follows it
                print(f"form submission page: {page.locator('p').first.inner_text()!r}")
                page.goto(server.url + "/")
                expect(page.locator("tr[data-team='Form <Team>'] td").nth(2)).to_have_text("80.0")
                print(f"board: {page.locator('#rows').inner_text()!r}")

                # The organiser freezes the board and rejudges Orbit (its stored verdict as an earlier, wrong
                # grader left it): the open page says it is frozen and marks the row rejudged, without a reload.
                page.evaluate("window.notReloaded = true")
                assert http(server.url + "/api/admin/freeze", token=organiser, data=b"{}", kind="application/json").status == 200
                expect(page.locator("#frozen")).to_contain_text("The board is frozen since", timeout=30_000)
                with sqlite3.connect(tmp_path / "arena.db") as connection:
                    connection.execute("""update kata_result set points = 0, summary = replace(summary, '"points": 80.0',
                                          '"points": 0.0') where submission_id = 1""")
                rejudged = http(server.url + "/api/admin/rejudgings", token=organiser, data=b'{"teams": ["Orbit"]}',
                                kind="application/json")  # the API (arena.py rejudge: test_arena_controls.py)
                assert rejudged.status == 201 and rejudged.json()["id"] == 1, rejudged.text
                server.wait_for(lambda: http(server.url + "/api/admin/rejudgings/1", token=organiser).json()["status"]
                                == "ready", 600, "the rejudging graded")
                assert http(server.url + "/api/admin/rejudgings/1/apply", token=organiser, data=b"{}",
                            kind="application/json").json()["changed"] == 1
                orbit_row = page.locator("tr[data-team='Orbit'] td")
                expect(orbit_row.last).to_have_text("rejudged", timeout=30_000)
                expect(orbit_row.nth(2)).to_have_text("80.0")
                assert page.evaluate("window.notReloaded") is True
                print(f"frozen, rejudged board: {page.locator('#frozen').inner_text()!r} {page.locator('#rows').inner_text()!r}")
                assert not [m for m in console if "Content Security Policy" in m], console
            finally:
                browser.close()
    finally:
        starting.exception()  # started (or failed to) before it is stopped
        pool.shutdown()
        if cli is not None and cli.poll() is None:
            cli.kill()
            cli.wait()
        server.stop()




def test_at_the_close_the_open_board_drops_its_form_and_shows_the_seed(tmp_path):
    """The board open on a phone (390 px wide): laid out at 390 px (the viewport tag; without it, 980); the
    organiser closes the competition: the upload form goes and the seed shows, without a reload. (Before:
    the form stayed and the seed came only with a reload.) No grading: the server grades nothing."""
    missing = browser_missing()
    if missing:
        pytest.skip(missing)
    from playwright.sync_api import expect, sync_playwright

    db_file = tmp_path / "arena.db"
    db = f"sqlite:///{db_file}"
    create(db, "--kata", "04_dce")
    server = Server(db, tmp_path, "--grading-threads", "0")
    pool = ThreadPoolExecutor(1)
    starting = pool.submit(server.start)  # the server starts while chromium does
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch_persistent_context(
                str(tmp_path / "profile"), executable_path=str(CHROMIUM), headless=True, args=FLAGS,
                viewport={"width": 390, "height": 844}, is_mobile=True, has_touch=True, device_scale_factor=3)
            try:
                starting.result()
                page = browser.new_page()
                console = []
                page.on("console", lambda message: console.append(message.text))
                page.goto(server.url + "/")
                expect(page.locator("#upload")).to_be_visible()
                assert page.evaluate("window.innerWidth") == 390
                page.evaluate("window.notReloaded = true")
                # the event stream's first event is in: the board redrew itself once ("updated now" -> a time)
                expect(page.locator("#updated")).not_to_have_text("now", timeout=30_000)
                with sqlite3.connect(db_file) as connection:  # what `arena.py close` does first
                    connection.execute("update competition set closed = 1")
                    seed = connection.execute("select seed from competition").fetchone()[0]
                expect(page.locator("#upload")).to_have_count(0, timeout=30_000)
                expect(page.locator("#seed")).to_have_text(f"The seed was {seed}.")
                expect(page.locator("#state")).to_have_text("closed")
                assert page.evaluate("window.notReloaded") is True
                assert not [m for m in console if "Content Security Policy" in m], console
            finally:
                browser.close()
    finally:
        starting.exception()
        pool.shutdown()
        server.stop()


def test_without_the_browser_the_skip_names_what_is_missing(monkeypatch, tmp_path):
    module = sys.modules[__name__]
    monkeypatch.setattr(module, "CHROMIUM", tmp_path / "chromium")
    assert browser_missing().startswith(f"Debian's chromium is missing: {tmp_path / 'chromium'} does not exist")
    monkeypatch.setattr(module, "CHROMIUM", Path(sys.executable))  # present; now the package is not
    monkeypatch.setitem(sys.modules, "playwright.sync_api", None)
    assert browser_missing() == "the playwright package is missing (`uv sync` installs the dev group)"
