"""The tutorials in a real JupyterLab, driven by a real (headless) browser.

Starts JupyterLab (a free port, a token, ``--no-browser``, root allowed) on a copy of the
quickstart tutorial whose outputs are cleared, opens it in headless Chromium through Selenium and
the system's chromedriver, runs its first cells with Shift+Enter, and checks what the page
renders: the printed text of the data cell and the figure of the next one. A screenshot is
saved in the test's tmp dir (``jupyterlab.png``).

Needs Debian's ``chromium`` and ``chromium-driver`` (``make test`` installs them when apt-get is
usable as root); without them the test is skipped with the reason. No browser is downloaded.
"""
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request

import nbformat
import pytest

pytestmark = pytest.mark.browser

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
TUTORIAL = os.path.join(ROOT, "notebooks", "tutorials", "01_quickstart.ipynb")
CHROMIUM = next(filter(None, map(shutil.which, ("chromium", "chromium-browser", "google-chrome"))), None)
CHROMEDRIVER = shutil.which("chromedriver")
# Chromium as the machine notes prescribe: no sandbox as root, no GPU, no background connections.
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--disable-dev-shm-usage", "--window-size=1400,1000")
EXPECTED_TEXT = "4096 training pairs, images (4096, 3, 64, 64)"  # the data cell's first line


def _skip_reason() -> str | None:
    if CHROMIUM is None:
        return ("Chromium is not installed (make test installs Debian's chromium and chromium-driver "
                "when apt-get is usable as root)")
    if CHROMEDRIVER is None:
        return "chromedriver is not installed (Debian package chromium-driver)"
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install -e '.[test]')"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def lab(tmp_path):
    """(base URL, token) of a JupyterLab serving a copy of the quickstart without outputs."""
    served = tmp_path / "lab"
    served.mkdir()
    nb = nbformat.read(TUTORIAL, as_version=4)
    for cell in nb.cells:  # fresh outputs only: whatever the page shows was computed now
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    nbformat.write(nb, served / "01_quickstart.ipynb")
    port, token = _free_port(), secrets.token_hex(16)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])),
           "OMP_NUM_THREADS": "1", "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime"),
           "JUPYTER_CONFIG_DIR": str(tmp_path / "config")}
    log = open(tmp_path / "jupyterlab.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "jupyterlab", "--no-browser", "--allow-root", "--ServerApp.ip=127.0.0.1",
         f"--ServerApp.port={port}", "--ServerApp.port_retries=0", f"--IdentityProvider.token={token}",
         f"--ServerApp.root_dir={served}", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"],
        cwd=served, env=env, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 120
        while True:
            try:
                with urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=5) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.time() > deadline:
                log.flush()
                pytest.fail(f"JupyterLab did not start:\n{(tmp_path / 'jupyterlab.log').read_text()[-3000:]}")
            time.sleep(0.5)
        yield base, token
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


@pytest.fixture
def browser(tmp_path):
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    from selenium import webdriver

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in CHROMIUM_FLAGS + (f"--user-data-dir={tmp_path / 'chromium-profile'}",):
        options.add_argument(flag)
    service = webdriver.ChromeService(executable_path=CHROMEDRIVER, log_output=str(tmp_path / "chromedriver.log"))
    driver = webdriver.Chrome(options=options, service=service)
    try:
        yield driver
    finally:
        driver.quit()


def test_quickstart_runs_in_jupyterlab(browser, lab, tmp_path):
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import WebDriverWait

    base, token = lab
    browser.get(f"{base}/lab/tree/01_quickstart.ipynb?token={token}")
    wait = WebDriverWait(browser, 180, ignored_exceptions=(StaleElementReferenceException,))
    cells = ".jp-NotebookPanel .jp-Notebook .jp-Cell"
    wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, cells)) >= 5)  # rendered (cells are re-created)
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, ".jp-NotebookPanel .jp-Notebook-ExecutionIndicator"
                                                          "[data-status='idle']"))  # the kernel is up
    time.sleep(1)
    browser.find_elements(By.CSS_SELECTOR, cells)[0].click()  # select the title cell (command mode)
    for _ in range(5):  # title, imports + setup, data heading, the data cell, its figure
        ActionChains(browser).key_down(Keys.SHIFT).send_keys(Keys.ENTER).key_up(Keys.SHIFT).perform()
        time.sleep(0.5)

    def output_with(text):
        def found(driver):
            for out in driver.find_elements(By.CSS_SELECTOR, ".jp-Cell .jp-OutputArea-output"):
                if text in out.text:
                    return out
            return False
        return found

    printed = wait.until(output_with(EXPECTED_TEXT))
    figure = wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, ".jp-Cell .jp-OutputArea-output img"))
    errors = browser.find_elements(By.CSS_SELECTOR, ".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.error']")
    for button in browser.find_elements(By.XPATH, "//div[contains(@class, 'Toastify')]//button[text()='No']"):
        button.click()  # JupyterLab's "get notified about news?" toast: not part of the picture
    cell = printed.find_element(By.XPATH, "./ancestor::div[contains(@class, 'jp-CodeCell')]")
    browser.execute_script("arguments[0].scrollIntoView({block: 'start'});", cell)
    time.sleep(0.5)
    screenshot = tmp_path / "jupyterlab.png"
    assert browser.save_screenshot(str(screenshot)) and screenshot.stat().st_size > 10_000
    assert not errors, [e.text for e in errors]
    assert "two objects" in printed.text or "one object" in printed.text  # the caption printed below the sizes
    assert figure[0].size["width"] > 200  # the figure of three training images with their captions
    cells = browser.find_elements(By.CSS_SELECTOR, ".jp-CodeCell .jp-InputPrompt")
    assert [c.text for c in cells[:3]] == ["[1]:", "[2]:", "[3]:"]  # run in order, by this page
