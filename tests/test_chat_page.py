"""The chat page at / in a real browser (headless Chromium from Debian's packages, driven by Selenium) against a
real `pyinfer serve` with SmolLM2: the API key typed once, a prompt typed, streamed text seen arriving, Stop
pressed, and the server's running count back to 0 with its KV freed. The screenshot goes to bench/results/.

Without a browser the test skips and says why; CI sets PYINFER_REQUIRE_BROWSER=1, so there a missing browser
fails instead."""
import os
import shutil
import time
from pathlib import Path

import pytest

pytest.importorskip("uvicorn")
pytest.importorskip("fastapi")

from support import serve_helpers  # noqa: E402

KEY = "page-key"
SCREENSHOT = Path(__file__).resolve().parents[1] / "bench" / "results" / "serving" / "chat_page.png"


def browser_paths():
    """(chromium, chromedriver) or a reason they cannot be used."""
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install selenium)"
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if not chromium or not driver:
        return "no chromium / chromedriver on PATH (apt-get install -y chromium chromium-driver)"
    return chromium, driver


@pytest.fixture(scope="module")
def browser():
    found = browser_paths()
    if isinstance(found, str):
        if os.environ.get("PYINFER_REQUIRE_BROWSER"):
            pytest.fail(f"PYINFER_REQUIRE_BROWSER is set but {found}")
        pytest.skip(found)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = found[0]
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1100,760"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(found[1]), options=options)
    driver.set_page_load_timeout(30)
    yield driver
    driver.quit()


@pytest.fixture(scope="module")
def server(real_model_path):
    base, loop, _, srv, t = serve_helpers.start_server(real_model_path, KEY, kv_budget=2048)
    yield base, loop
    serve_helpers.stop_server(srv, t, loop)


def wait_for(predicate, timeout=30.0, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def by_id(driver, name):
    from selenium.webdriver.common.by import By

    return driver.find_element(By.ID, name)


def test_the_page_streams_a_reply_and_stop_frees_the_request(browser, server):
    from selenium.webdriver.common.by import By

    base, loop = server
    browser.get(base + "/")
    # The server wants a key: the page says so and asks for it once.
    wait_for(lambda: by_id(browser, "key-form").is_displayed(), what="the API key form")
    by_id(browser, "api-key").send_keys(KEY)
    by_id(browser, "key-form").find_element(By.TAG_NAME, "button").click()
    wait_for(lambda: "SmolLM2" in by_id(browser, "model-name").text, what="the model's name")

    for field, value in (("max-tokens", "1500"), ("temperature", "0"), ("seed", "7")):
        by_id(browser, field).clear()
        by_id(browser, field).send_keys(value)
    by_id(browser, "system").send_keys("You are a patient counting assistant.")
    by_id(browser, "prompt").send_keys("Count from 1 to 400, one number per line.")
    by_id(browser, "send").click()

    def reply():
        found = browser.find_elements(By.CSS_SELECTOR, ".message.assistant")
        return found[-1] if found else None

    def tokens() -> int:  # chunks streamed into the reply so far (its text can shrink as Markdown re-renders)
        return int(reply().get_attribute("data-tokens") or 0) if reply() is not None else 0

    first = wait_for(lambda: tokens() >= 20 and tokens(), what="streamed text")
    wait_for(lambda: tokens() > first, what="more streamed text")
    assert reply().text.strip(), "streamed tokens but no text shown"
    assert reply().get_attribute("data-state") == "streaming", "the reply ended before Stop could be tested"
    assert loop.metrics()["running"] == 1
    wait_for(lambda: "tok/s" in by_id(browser, "status").text and "KV" in by_id(browser, "status").text,
             what="the status line")
    SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
    browser.save_screenshot(str(SCREENSHOT))

    cancelled = loop.stats["cancelled_total"]
    by_id(browser, "stop").click()
    wait_for(lambda: reply().get_attribute("data-state") == "stopped", what="the reply marked stopped")
    def drained():
        m = loop.metrics()
        return m if m["running"] == 0 and m["kv_used_tokens"] == 0 else None

    m = wait_for(drained, what="the server's running count back to 0")
    assert m["waiting"] == 0
    assert loop.stats["cancelled_total"] == cancelled + 1
    assert not by_id(browser, "send").get_attribute("disabled")  # ready for the next message


def test_model_output_is_never_parsed_as_html(browser, server):
    base, _ = server
    browser.get(base + "/")
    hostile = ("<img src=x onerror=\"window.pwned=1\"> **bold** *it* `<b>code</b>` [safe](https://example.org) "
               "[bad](javascript:window.pwned=2)\n\n- one\n- <script>window.pwned=3</script>\n\n```\n<iframe>\n```")
    counts = browser.execute_script(
        "const el = document.createElement('div'); renderMarkdown(el, arguments[0]); document.body.appendChild(el);"
        "return {img: el.querySelectorAll('img,script,iframe').length, strong: el.querySelectorAll('strong').length,"
        " em: el.querySelectorAll('em').length, li: el.querySelectorAll('li').length,"
        " links: Array.from(el.querySelectorAll('a')).map(a => a.href), pre: el.querySelectorAll('pre').length,"
        " text: el.textContent, pwned: window.pwned || 0};", hostile)
    assert counts["img"] == 0 and counts["pwned"] == 0
    assert counts["strong"] == 1 and counts["em"] == 1 and counts["li"] == 2 and counts["pre"] == 1
    assert counts["links"] == ["https://example.org/"]
    assert "<img src=x" in counts["text"] and "<script>" in counts["text"] and "<iframe>" in counts["text"]


def test_the_page_can_be_turned_off(real_model_path):
    import httpx

    base, loop, _, srv, t = serve_helpers.start_server(real_model_path, KEY, webui=False)
    try:
        assert httpx.get(base + "/").status_code == 404
        assert httpx.get(base + "/webui/chat.js").status_code == 404
    finally:
        serve_helpers.stop_server(srv, t, loop)


def test_only_the_pages_own_files_are_served(server):
    import httpx

    base, _ = server
    r = httpx.get(base + "/")
    assert r.status_code == 200 and "script-src 'self'" in r.headers["content-security-policy"]
    assert httpx.get(base + "/webui/chat.js").headers["content-type"].startswith("text/javascript")
    for path in ("/webui/__init__.py", "/webui/..%2Fserver.py", "/webui/%2e%2e/openai_api.py"):
        assert httpx.get(base + path).status_code == 404, path
