//! Pages of `cupool report --html` opened in a real headless Chromium, as a
//! person would open them: the script runs to its end with no console error
//! or exception, every process and device picked in the selector draws its
//! views with the model's figures (the timeline's and the bands' maxima at
//! the recorded peaks, the flame graphs' totals at the bytes live then, the
//! pool's allocated bytes), a page of a log of a million events loads in at
//! most 3 s, and screenshots at fixed sizes are kept in
//! `target/html-check/` to look at.
//!
//! Chromium is driven through its DevTools protocol over a pipe
//! (`--remote-debugging-pipe`: JSON messages on file descriptors 3 and 4),
//! with no other package. Without Chromium the test is skipped with a line
//! saying so, unless `CUPOOL_REQUIRE_BROWSER_AND_TERMINAL=1` (what `.ci/run`
//! sets, having installed it from Debian's packages) makes that a failure.
//! `CUPOOL_HTML_LOGS=DIR:DIR...` checks the pages of more logs the same way
//! (real GPU logs from `scripts/gpu-views.sh`).
//! `cargo test --release --test html_browser`
mod support;

use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Write};
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::time::{Duration, Instant};
use support::*;

/// The most a page of a million events may take to load and draw.
const LOAD_LIMIT: Duration = Duration::from_secs(3);

fn chromium() -> Option<PathBuf> {
    for name in ["chromium", "chromium-browser", "google-chrome", "google-chrome-stable"] {
        if let Ok(out) = Command::new("sh").arg("-c").arg(format!("command -v {name}")).output() {
            let path = String::from_utf8_lossy(&out.stdout).trim().to_string();
            if out.status.success() && !path.is_empty() {
                return Some(PathBuf::from(path));
            }
        }
    }
    assert!(
        std::env::var_os("CUPOOL_REQUIRE_BROWSER_AND_TERMINAL").is_none_or(|v| v != "1"),
        "Chromium is not installed (apt-get install -y chromium)"
    );
    eprintln!("SKIPPED: no chromium here (apt-get install -y chromium); the pages were not opened in a browser");
    None
}

/// A headless Chromium and one page of it, spoken to over the DevTools pipe.
struct Browser {
    child: Child,
    to: std::fs::File,
    from: Receiver<Value>,
    next: u64,
    session: String,
    /// Console errors and exceptions seen so far, one line each.
    errors: Vec<String>,
    _profile: PathBuf,
}

fn pipe() -> (OwnedFd, OwnedFd) {
    let mut fds = [0; 2];
    // SAFETY: `fds` has room for the two descriptors pipe2 writes.
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    // SAFETY: pipe2 succeeded: both descriptors are open, and owned by nothing else.
    unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) }
}

impl Browser {
    fn start(exe: &Path, dir: &Path) -> Browser {
        use std::os::fd::AsRawFd;
        let profile = dir.join("profile");
        let (cmd_r, cmd_w) = pipe();
        let (res_r, res_w) = pipe();
        let (in_fd, out_fd) = (cmd_r.as_raw_fd(), res_w.as_raw_fd());
        let mut cmd = Command::new(exe);
        cmd.args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--hide-scrollbars",
            "--remote-debugging-pipe",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join("chromium.stderr")).map_or(Stdio::null(), Stdio::from));
        // SAFETY: only async-signal-safe calls between fork and exec.
        unsafe {
            cmd.pre_exec(move || {
                // Out of the way first: either may already be 3 or 4 (and dup2 onto
                // itself would keep close-on-exec).
                let (a, b) = (libc::fcntl(in_fd, libc::F_DUPFD, 10), libc::fcntl(out_fd, libc::F_DUPFD, 10));
                if a < 0 || b < 0 || libc::dup2(a, 3) < 0 || libc::dup2(b, 4) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                libc::close(a);
                libc::close(b);
                Ok(())
            });
        }
        let child = cmd.spawn().expect("start chromium");
        drop((cmd_r, res_w));
        let (tx, rx) = channel();
        let reader = std::fs::File::from(res_r);
        std::thread::spawn(move || {
            let mut r = BufReader::new(reader);
            loop {
                let mut msg = Vec::new();
                match r.read_until(0, &mut msg) {
                    Ok(0) | Err(_) => return,
                    Ok(_) => {
                        msg.pop();
                        if let Ok(v) = serde_json::from_slice::<Value>(&msg) {
                            if tx.send(v).is_err() {
                                return;
                            }
                        }
                    }
                }
            }
        });
        let mut b = Browser {
            child,
            to: std::fs::File::from(cmd_w),
            from: rx,
            next: 0,
            session: String::new(),
            errors: Vec::new(),
            _profile: profile,
        };
        let target = b.call("Target.createTarget", json!({"url": "about:blank"}));
        let id = target["targetId"].as_str().expect("a target").to_string();
        let attached = b.call("Target.attachToTarget", json!({"targetId": id, "flatten": true}));
        b.session = attached["sessionId"].as_str().expect("a session").to_string();
        for domain in ["Page.enable", "Runtime.enable", "Log.enable"] {
            b.call(domain, json!({}));
        }
        b
    }

    /// Sends a command (to the page once attached) and waits for its answer.
    fn call(&mut self, method: &str, params: Value) -> Value {
        self.next += 1;
        let id = self.next;
        let mut msg = json!({"id": id, "method": method, "params": params});
        if !self.session.is_empty() {
            msg["sessionId"] = json!(self.session);
        }
        let mut bytes = serde_json::to_vec(&msg).unwrap();
        bytes.push(0);
        self.to.write_all(&bytes).expect("write to chromium");
        loop {
            let v = self.from.recv_timeout(Duration::from_secs(60)).unwrap_or_else(|_| panic!("no answer to {method}"));
            if v["id"] == id {
                if let Some(e) = v.get("error") {
                    panic!("{method}: {e}");
                }
                return v["result"].clone();
            }
            self.note(&v);
        }
    }

    /// Keeps what an event says about errors.
    fn note(&mut self, v: &Value) {
        let p = &v["params"];
        match v["method"].as_str() {
            Some("Runtime.exceptionThrown") => self.errors.push(format!("exception: {}", p["exceptionDetails"])),
            Some("Runtime.consoleAPICalled") if matches!(p["type"].as_str(), Some("error" | "assert")) => {
                self.errors.push(format!("console.{}: {}", p["type"], p["args"]))
            }
            Some("Log.entryAdded") if p["entry"]["level"] == "error" => {
                self.errors.push(format!("log: {}", p["entry"]["text"]))
            }
            _ => {}
        }
    }

    /// Waits for an event named `method`.
    fn wait_for(&mut self, method: &str, limit: Duration) {
        let end = Instant::now() + limit;
        loop {
            let left = end.saturating_duration_since(Instant::now());
            let v = self.from.recv_timeout(left).unwrap_or_else(|_| panic!("no {method} within {limit:?}"));
            self.note(&v);
            if v["method"] == method {
                return;
            }
        }
    }

    /// Opens `page` at `width` x `height` CSS pixels; how long it took to load and draw.
    fn open(&mut self, page: &Path, hash: &str, width: u32, height: u32) -> Duration {
        self.call(
            "Emulation.setDeviceMetricsOverride",
            json!({"width": width, "height": height, "deviceScaleFactor": 1, "mobile": false}),
        );
        // From a blank page: a new address that differs only in its #part would not load anew.
        self.call("Page.navigate", json!({"url": "about:blank"}));
        self.wait_for("Page.loadEventFired", Duration::from_secs(60));
        let url = format!("file://{}{hash}", page.display());
        let start = Instant::now();
        self.call("Page.navigate", json!({"url": url}));
        self.wait_for("Page.loadEventFired", Duration::from_secs(60));
        let took = start.elapsed();
        assert_eq!(
            self.eval("document.body.getAttribute('data-cupool-drawn')"),
            "1",
            "{}: the script did not finish",
            page.display()
        );
        took
    }

    /// The value of a JavaScript expression.
    fn eval(&mut self, expr: &str) -> Value {
        let r = self.call("Runtime.evaluate", json!({"expression": expr, "returnByValue": true}));
        if let Some(e) = r.get("exceptionDetails") {
            panic!("{expr}: {e}");
        }
        r["result"]["value"].clone()
    }

    /// A PNG of what the page shows now.
    fn screenshot(&mut self, file: &Path) {
        let r = self.call("Page.captureScreenshot", json!({"format": "png"}));
        let png = base64(r["data"].as_str().expect("image data"));
        assert!(png.starts_with(b"\x89PNG"), "not a PNG");
        std::fs::write(file, png).unwrap();
    }

    fn mouse(&mut self, kind: &str, x: f64, y: f64) {
        let button = if kind == "mouseMoved" { "none" } else { "left" };
        self.call("Input.dispatchMouseEvent", json!({"type": kind, "x": x, "y": y, "button": button, "clickCount": 1}));
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn base64(text: &str) -> Vec<u8> {
    let value = |c: u8| match c {
        b'A'..=b'Z' => Some(c - b'A'),
        b'a'..=b'z' => Some(c - b'a' + 26),
        b'0'..=b'9' => Some(c - b'0' + 52),
        b'+' => Some(62),
        b'/' => Some(63),
        _ => None,
    };
    let mut out = Vec::with_capacity(text.len() * 3 / 4);
    let (mut acc, mut bits) = (0u32, 0);
    for v in text.bytes().filter_map(value) {
        acc = (acc << 6) | u32::from(v);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
        }
    }
    out
}

/// What every process and device of the open page draws, picked one by one
/// in the selectors: each view's canvas markers.
const EVERY_VIEW: &str = r#"(() => {
  const sels = document.querySelectorAll(".bar select, select");
  const [selP, selD] = [sels[0], sels[1]];
  const out = [];
  for (let p = 0; p < selP.options.length; p++) {
    selP.value = String(p); selP.dispatchEvent(new Event("change"));
    for (let d = 0; d < selD.options.length; d++) {
      selD.value = selD.options[d].value; selD.dispatchEvent(new Event("change"));
      const views = {};
      for (const c of document.querySelectorAll("canvas")) {
        views[c.getAttribute("data-view")] = Object.fromEntries([...c.attributes].filter(a => a.name.startsWith("data-")).map(a => [a.name, a.value]));
      }
      out.push({p, device: selD.value, views});
    }
  }
  selP.value = "0"; selP.dispatchEvent(new Event("change"));
  return JSON.stringify(out);
})()"#;

/// Opens `page`, checks every view of every process and device, drives the
/// first ones with the mouse, and keeps screenshots named `name-*.png`.
fn check_page(b: &mut Browser, page: &Path, name: &str, shots: &Path) -> Duration {
    let took = b.open(page, "", 1280, 900);
    let body: Value = serde_json::from_str(
        b.eval("JSON.stringify(Object.fromEntries([...document.body.attributes].map(a => [a.name, a.value])))")
            .as_str()
            .unwrap(),
    )
    .unwrap();
    for (got, want) in [
        ("data-cupool-plot-max", "data-cupool-peak"),
        ("data-cupool-plot-max-reserved", "data-cupool-peak-reserved"),
        ("data-cupool-bands-max", "data-cupool-peak"),
        ("data-cupool-flame-peak", "data-cupool-flame-peak-want"),
        ("data-cupool-flame-end", "data-cupool-flame-end-want"),
    ] {
        assert_eq!(body[got], body[want], "{name}: {got} against {want}: {body}");
    }
    let views: Value = serde_json::from_str(b.eval(EVERY_VIEW).as_str().unwrap()).unwrap();
    let views = views.as_array().unwrap();
    assert_eq!(views.len(), body["data-cupool-plots"].as_str().unwrap().parse::<usize>().unwrap(), "{name}");
    for v in views {
        let t = &v["views"]["timeline"];
        assert_eq!(t["data-plot-max"], t["data-peak"], "{name}: {v}");
        assert_eq!(t["data-plot-max-reserved"], t["data-peak-reserved"], "{name}: {v}");
        assert_eq!(t["data-bands-max"], t["data-peak"], "{name}: {v}");
        let f = &v["views"]["flame"];
        assert_eq!(f["data-flame-total"], f["data-flame-want"], "{name}: {v}");
        let p = &v["views"]["pool"];
        if !p.is_null() {
            assert_eq!(p["data-pool-allocated"], p["data-pool-want-allocated"], "{name}: {v}");
        }
    }
    // A person's first moves: hover the timeline, click into the flame graph, unfold it.
    let rect = |b: &mut Browser, view: &str| -> (f64, f64, f64, f64) {
        let r = b.eval(&format!(
            "(() => {{ const r = document.querySelector('canvas[data-view={view}]').getBoundingClientRect(); return [r.left, r.top, r.width, r.height]; }})()"
        ));
        let n = |i: usize| r[i].as_f64().unwrap();
        (n(0), n(1), n(2), n(3))
    };
    b.eval("document.getElementById('sec-timeline').scrollIntoView()");
    let (x, y, w, h) = rect(b, "timeline");
    b.mouse("mouseMoved", x + w * 0.6, y + h * 0.8);
    let tip = b.eval("document.querySelector('.tip').textContent").as_str().unwrap_or("").to_string();
    assert!(tip.contains("allocated "), "{name}: the timeline's tooltip: {tip:?}");
    b.screenshot(&shots.join(format!("{name}-timeline.png")));
    b.eval("document.getElementById('sec-flame').scrollIntoView()");
    let (x, y, w, _) = rect(b, "flame");
    b.mouse("mousePressed", x + w * 0.2, y + 27.0);
    b.mouse("mouseReleased", x + w * 0.2, y + 27.0);
    b.screenshot(&shots.join(format!("{name}-flame.png")));
    b.eval("(() => { const c = document.querySelector('input[type=checkbox]'); c.click(); return c.checked; })()");
    b.eval("document.getElementById('sec-pool').scrollIntoView()");
    b.screenshot(&shots.join(format!("{name}-pool.png")));
    assert!(b.errors.is_empty(), "{name}: {:?}", b.errors);
    took
}

fn report_html(logs: &Path, page: &Path, dir: &Path) {
    let out = run_cupool(&["report", "--html", path_str(page), path_str(logs)], dir);
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
}

fn check_loop() -> PathBuf {
    let mut args = link_fake_cudart();
    args.push("-ldl".into());
    compile_fake_program("check_loop", "check_loop.c", &args)
}

#[test]
fn pages_open_in_chromium_with_the_models_figures_and_a_million_events_load_in_3_s() {
    let Some(exe) = chromium() else { return };
    let dir = scratch_dir("html-browser");
    let shots = target_dir().join("html-check");
    std::fs::create_dir_all(&shots).unwrap();
    let prog = check_loop();
    let mut pages: Vec<(String, PathBuf)> = Vec::new();
    // One process in pool mode; several processes and devices and a killed one (the edge logs).
    let one = dir.join("one");
    let out = run_preloaded(&prog, &["300", "wave", "mark"], &one, "");
    assert!(out.status.success(), "{}", stderr_of(&out));
    pages.push(("one-process".into(), dir.join("one.html")));
    report_html(&one, &pages[0].1, &dir);
    let edge = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/logs/edge");
    pages.push(("several-processes".into(), dir.join("edge.html")));
    report_html(&edge, &pages[1].1, &dir);
    // A process killed mid-run, on its own.
    let killed = dir.join("killed");
    let (mut child, _) =
        spawn_until(preloaded_command(&fakes().prog("prog_sleep"), &["60"], &killed, "flush_ms=50"), "ready");
    assert!(wait_for_flushed(&killed, "alloc", 50));
    send_signal(child.id(), libc::SIGKILL);
    let _ = child.wait();
    pages.push(("killed".into(), dir.join("killed.html")));
    report_html(&killed, &pages[2].1, &dir);
    // A million events: a training loop of 167,000 marked steps.
    let big = dir.join("big");
    let out = run_preloaded(&prog, &["167000", "wave", "mark"], &big, "");
    assert!(out.status.success(), "{}", stderr_of(&out));
    let big_page = dir.join("big.html");
    report_html(&big, &big_page, &dir);

    let mut b = Browser::start(&exe, &dir);
    for (name, page) in &pages {
        check_page(&mut b, page, name, &shots);
    }
    // The big page: the best of two loads (the first also starts the browser's caches).
    let loads: Vec<Duration> = (0..2).map(|_| b.open(&big_page, "", 1280, 900)).collect();
    let best = *loads.iter().min().unwrap();
    let script_ms = b.eval("document.body.getAttribute('data-cupool-ms')");
    eprintln!("a page of a million events: loaded and drawn in {loads:?} (its script: {script_ms} ms)");
    assert!(best <= LOAD_LIMIT, "a million events took {best:?} to load and draw");
    check_page(&mut b, &big_page, "million-events", &shots);
    // Logs gathered elsewhere (a GPU's: scripts/gpu-views.sh), directories separated by `:`.
    for (i, logs) in
        std::env::var("CUPOOL_HTML_LOGS").unwrap_or_default().split(':').filter(|s| !s.is_empty()).enumerate()
    {
        let page = dir.join(format!("extra-{i}.html"));
        report_html(Path::new(logs), &page, &dir);
        let name =
            format!("extra-{}", Path::new(logs).file_name().map_or(i.to_string(), |n| n.to_string_lossy().into()));
        let took = check_page(&mut b, &page, &name, &shots);
        eprintln!("{logs}: checked in Chromium, loaded in {took:?}");
    }
    // Screenshots of one view alone, as the README shows them.
    for view in ["timeline", "flame", "pool"] {
        b.open(&pages[0].1, &format!("#p=0&d=0&only={view}"), 1000, 520);
        b.screenshot(&shots.join(format!("only-{view}.png")));
    }
    assert!(b.errors.is_empty(), "{:?}", b.errors);
}
