#!/usr/bin/env bash
# timeline_screenshot.sh runs a 2-worker tfdist job with `launch --timeline`,
# opens its trace in a real browser, and saves a screenshot of a few mid-run
# steps of both tasks (the README's docs/images/timeline.png).
#
# Usage:
#   scripts/timeline_screenshot.sh [OUT.png]     # default docs/images/timeline.png
#
# What it does:
#   1. Builds cmd/tfdist and runs
#        tfdist launch --workers 2 --timeline trace.json -- tfdist demo -strategy multiworker -steps 60
#      and prints the job's breakdown table.
#   2. Finds Chromium (CHROMIUM, or chromium / chromium-browser / google-chrome on PATH).
#      When there is none and this runs as root on Debian or Ubuntu, it installs the
#      distribution's package (apt-get install chromium); nothing is downloaded from
#      Google. chrome://tracing cannot be used: recent Chromium builds no longer ship
#      its viewer (the page fails with ERR_FAILED even with internal debug pages on).
#   3. Serves, on 127.0.0.1, the same Catapult trace viewer that chrome://tracing was
#      built from, as the Go toolchain ships it for `go tool trace`
#      ($GOROOT/src/internal/trace/traceviewer/static), with a page that loads the
#      trace into it. Chromium runs headless and is driven over the DevTools protocol
#      on a pipe (--remote-debugging-pipe) by a Python script that uses only the
#      standard library: it zooms to TIMELINE_WINDOW_MS from the start of step
#      TIMELINE_STEP (or of the first later step whose window has no overlapping spans
#      in a row, which the viewer would draw over each other), collapses the lanes with nothing in
#      that window, selects the collective with the longest wait for a peer there (its
#      arguments fill the bottom panel), fits the page's height to the lanes, and
#      takes the screenshot. optipng shrinks it when installed.
#
# Variables:
#   TFDIST_TRACE        render this trace instead of running a job (skips step 1)
#   TIMELINE_TRACE_OUT  also keep the job's trace at this path
#   TIMELINE_STEPS      steps of the demo job (default 60)
#   TIMELINE_STEP       the step the window starts at (default TIMELINE_STEPS/2)
#   TIMELINE_WINDOW_MS  width of the window in milliseconds (default 10)
#   TIMELINE_SIZE       page size WIDTHxHEIGHT (default 1400x840); the screenshot's height
#                       then grows or shrinks to fit the lanes
#   CHROMIUM            the browser binary to use
#   TFDIST_CACHE        cache directory (default ${XDG_CACHE_HOME:-$HOME/.cache}/tfdist),
#                       for libtensorflow (scripts/libtensorflow.sh)
set -euo pipefail

log() { echo "timeline_screenshot: $*" >&2; }
case "${1:-}" in
  -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
esac

ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${1:-$ROOT/docs/images/timeline.png}
case "$OUT" in /*) ;; *) OUT=$PWD/$OUT ;; esac
STEPS=${TIMELINE_STEPS:-60}
STEP=${TIMELINE_STEP:-$((STEPS / 2))}
WINDOW_MS=${TIMELINE_WINDOW_MS:-10}
SIZE=${TIMELINE_SIZE:-1400x840}

WORK=$(mktemp -d "${TMPDIR:-/tmp}/tfdist-timeline.XXXXXX")
trap 'rm -rf "$WORK"' EXIT INT TERM

# 1. The trace.
if [ -n "${TFDIST_TRACE:-}" ]; then
  cp "$TFDIST_TRACE" "$WORK/trace.json"
else
  cd "$ROOT"
  eval "$(scripts/libtensorflow.sh)"
  log "building cmd/tfdist"
  go build -o "$WORK/tfdist" ./cmd/tfdist
  log "running a 2-worker job ($STEPS steps) with --timeline"
  if ! (cd "$WORK" && ./tfdist launch --workers 2 --timeline "$WORK/trace.json" -- \
      "$WORK/tfdist" demo -strategy multiworker -steps "$STEPS") >"$WORK/job.log" 2>&1; then
    tail -n 30 "$WORK/job.log" >&2
    log "the job failed"
    exit 1
  fi
  sed -n '/^Where each task/,$p' "$WORK/job.log" >&2
  if [ -n "${TIMELINE_TRACE_OUT:-}" ]; then cp "$WORK/trace.json" "$TIMELINE_TRACE_OUT"; fi
fi

# 2. The browser.
find_chromium() {
  local c
  for c in "${CHROMIUM:-}" chromium chromium-browser google-chrome google-chrome-stable; do
    [ -n "$c" ] && command -v "$c" >/dev/null 2>&1 && { command -v "$c"; return 0; }
  done
  return 1
}
if ! BROWSER=$(find_chromium); then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    log "installing Chromium from the distribution (apt-get install chromium)"
    apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >&2
  fi
  BROWSER=$(find_chromium) || { log "no Chromium: install your distribution's chromium package or set CHROMIUM"; exit 1; }
fi
log "browser: $("$BROWSER" --version 2>/dev/null | head -n 1)"

# 3. The viewer: Catapult, as the Go toolchain ships it.
GOROOT_DIR=$(go env GOROOT)
VIEWER=
for d in src/internal/trace/traceviewer/static src/cmd/trace/static misc/trace; do
  if [ -f "$GOROOT_DIR/$d/trace_viewer_full.html" ] && [ -f "$GOROOT_DIR/$d/webcomponents.min.js" ]; then
    VIEWER=$GOROOT_DIR/$d
    break
  fi
done
[ -n "$VIEWER" ] || { log "no trace_viewer_full.html in the Go toolchain at $GOROOT_DIR"; exit 1; }
mkdir -p "$WORK/site/static"
cp "$VIEWER/trace_viewer_full.html" "$VIEWER/webcomponents.min.js" "$WORK/site/static/"
mv "$WORK/trace.json" "$WORK/site/trace.json"
cat >"$WORK/site/index.html" <<'EOF'
<!DOCTYPE html>
<html>
<head>
<meta charset="utf-8">
<script src="static/webcomponents.min.js"></script>
<link rel="import" href="static/trace_viewer_full.html">
<style>
  html, body { box-sizing: border-box; overflow: hidden; margin: 0; padding: 0; width: 100%; height: 100%; }
  #trace-viewer { width: 100%; height: 100%; }
  #trace-viewer:focus { outline: none; }
</style>
<script>
'use strict';
// The embedding of Catapult's docs (tracing/docs/embedding-trace-viewer.md), as go tool trace does it.
window.shot = {state: 'loading'};
document.addEventListener('WebComponentsReady', function() {
  var container = document.createElement('track-view-container');
  container.id = 'track_view_container';
  var viewer = document.createElement('tr-ui-timeline-view');
  viewer.track_view_container = container;
  Polymer.dom(viewer).appendChild(container);
  viewer.id = 'trace-viewer';
  viewer.globalMode = true;
  Polymer.dom(document.body).appendChild(viewer);
  window.shot.viewer = viewer;
  fetch('trace.json').then(function(r) { return r.text(); }).then(function(text) {
    var model = new tr.Model();
    var opts = new tr.importer.ImportOptions();
    opts.shiftWorldToZero = true;
    return new tr.importer.Import(model, opts).importTracesWithProgressDialog([text]).then(function() {
      viewer.model = model;
      viewer.viewTitle = 'tfdist launch --timeline';
      window.shot.model = model;
      window.shot.state = 'loaded';
    });
  }).catch(function(err) { window.shot.state = 'error: ' + err; });
});
</script>
</head>
<body></body>
</html>
EOF

cat >"$WORK/shot.py" <<'EOF'
"""Drives headless Chromium over the DevTools protocol on a pipe (fds 3 and 4)."""
import base64, functools, http.server, json, os, subprocess, sys, threading, time

browser, site, out, profile, step, window_ms, size = sys.argv[1:8]
width, height = (int(x) for x in size.split("x"))

to_browser_r, to_browser_w = os.pipe()
from_browser_r, from_browser_w = os.pipe()

def child_fds():
    # Copies first, so that dup2 never gets its own fd (it would keep close-on-exec).
    r, w = os.dup(to_browser_r), os.dup(from_browser_w)
    os.dup2(r, 3)
    os.dup2(w, 4)

args = [browser, "--headless=new", "--remote-debugging-pipe", "--user-data-dir=" + profile,
        "--no-first-run", "--no-default-browser-check", "--disable-gpu", "--hide-scrollbars",
        "--mute-audio", "--force-device-scale-factor=1", f"--window-size={width},{height}", "about:blank"]
if os.geteuid() == 0:
    args.insert(1, "--no-sandbox")  # Chromium refuses to run as root with its sandbox
# Started before the server thread: preexec_fn is unsafe once threads run.
proc = subprocess.Popen(args, preexec_fn=child_fds, close_fds=False,
                        stdout=subprocess.DEVNULL, stderr=open(os.path.join(profile, "..", "chromium.log"), "w"))
os.close(to_browser_r)
os.close(from_browser_w)

class Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass

handler = functools.partial(Quiet, directory=site)
server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
threading.Thread(target=server.serve_forever, daemon=True).start()
url = f"http://127.0.0.1:{server.server_address[1]}/index.html"

buf = b""
next_id = 0
deadline = time.monotonic() + 180

def call(method, session=None, **params):
    global buf, next_id
    next_id += 1
    msg = {"id": next_id, "method": method, "params": params}
    if session:
        msg["sessionId"] = session
    try:
        os.write(to_browser_w, json.dumps(msg).encode() + b"\0")
    except BrokenPipeError:
        raise SystemExit("Chromium closed the DevTools pipe (see chromium.log)")
    while True:
        if time.monotonic() > deadline:
            raise SystemExit("timed out talking to Chromium")
        while b"\0" not in buf:
            chunk = os.read(from_browser_r, 1 << 20)
            if not chunk:
                raise SystemExit("Chromium closed the DevTools pipe (see chromium.log)")
            buf += chunk
        raw, buf = buf.split(b"\0", 1)
        reply = json.loads(raw)
        if reply.get("id") == next_id:
            if "error" in reply:
                raise SystemExit(f"{method}: {reply['error']}")
            return reply["result"]

def js(session, expr):
    r = call("Runtime.evaluate", session, expression=expr, returnByValue=True, awaitPromise=True)
    if "exceptionDetails" in r:
        raise SystemExit("page script failed: " + json.dumps(r["exceptionDetails"])[:1500])
    return r["result"].get("value")

try:
    target = call("Target.createTarget", url="about:blank")["targetId"]
    s = call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
    call("Emulation.setDeviceMetricsOverride", s, width=width, height=height, deviceScaleFactor=1, mobile=False)
    call("Page.navigate", s, url=url)
    state = "loading"
    for _ in range(240):
        time.sleep(0.25)
        state = js(s, "window.shot ? window.shot.state : 'loading'")
        if state != "loading":
            break
    if state != "loaded":
        raise SystemExit(f"the trace viewer did not load the trace: {state}")
    # Let the viewer set its initial viewport before ours replaces it.
    js(s, "new Promise(r => setTimeout(r, 1000))")
    result = js(s, """(() => {
      const v = shot.viewer, m = shot.model, STEP = %d, WINDOW = %f;
      v.$['polyfill-warning'].clearMessages();  // the banner's own Hide
      const all = [], stepStart = new Map();
      for (const p of Object.values(m.processes))
        for (const t of Object.values(p.threads)) {
          for (const sl of t.sliceGroup.slices) {
            all.push(sl);
            const n = /^step (\d+)$/.exec(sl.title);
            if (n) stepStart.set(+n[1], Math.min(stepStart.get(+n[1]) ?? Infinity, sl.start));
          }
        }
      if (!stepStart.has(STEP)) return {error: 'no span named "step ' + STEP + '" in the trace'};
      // The lanes as the viewer laid them out: each thread track, and its rows of spans.
      const lanes = [];
      (function walk(e) {
        for (const k of Array.from(e.children || [])) {
          if (k.thread === undefined) { walk(k); continue; }
          lanes.push({track: k, rows: Array.from(k.children).flatMap(c => c.subRows || [])});
        }
      })(v.trackView);
      // A window is clean when no two spans of a row overlap there: the viewer
      // would draw them over each other.
      const clean = (lo, hi) => lanes.every(l => l.rows.every(row => {
        const in_ = row.filter(sl => sl.end > lo && sl.start < hi).sort((a, b) => a.start - b.start);
        return in_.every((sl, i) => i === 0 || sl.start >= in_[i - 1].end);
      }));
      let chosen = STEP;
      for (let n = STEP; stepStart.has(n); n++)
        if (clean(stepStart.get(n) - 0.2, stepStart.get(n) - 0.2 + WINDOW)) { chosen = n; break; }
      const lo = stepStart.get(chosen) - 0.2, hi = lo + WINDOW;
      // Select the collective that waited longest for a peer in the window.
      let best = null, longest = -1;
      for (const sl of all)
        if (sl.category === 'wait' && sl.start >= lo && sl.end <= hi && sl.duration > longest) {
          longest = sl.duration; best = sl.parentSlice || sl;
        }
      if (best) v.brushingStateController.changeSelectionFromTimeline(new tr.model.EventSet([best]));
      v.$.analysis.style.height = '310px';
      // Collapse the lanes with nothing in the window (their ▾ toggles).
      for (const l of lanes)
        if (!l.track.thread.sliceGroup.slices.some(sl => sl.end > lo && sl.start < hi))
          for (const track of Array.from(l.track.children))
            if (track.expanded !== undefined) track.expanded = false;
      for (const e of Array.from(v.trackView.children))
        if (e.tagName === 'TR-UI-B-MOUSE-MODE-SELECTOR') e.style.display = 'none';
      shot.zoom = () => {
        const vp = v.trackView.viewport;
        const dt = new tr.ui.TimelineDisplayTransform();
        dt.xSetWorldBounds(lo, hi, vp.modelTrackContainer.canvas.clientWidth);
        vp.setDisplayTransformImmediately(dt);
      };
      shot.zoom();
      return {step: chosen, clean: clean(lo, hi), lo: lo, hi: hi, selected: best ? best.title + ' on ' + best.parentContainer.parent.userFriendlyName : null};
    })()""" % (int(step), float(window_ms)))
    if result.get("error"):
        raise SystemExit(result["error"])
    settle = "new Promise(r => requestAnimationFrame(() => requestAnimationFrame(() => setTimeout(r, 500))))"
    js(s, settle)
    # Fit the page's height to the lanes, so that neither they scroll nor a blank band shows.
    extra = js(s, "(() => { const c = shot.viewer.trackView.viewport.modelTrackContainer;"
                  " const lanes = Array.from(c.children).find(e => e.tagName !== 'CANVAS');"
                  " return lanes.offsetHeight - c.clientHeight; })()")
    fitted = max(480, min(1600, height + extra))
    if fitted != height:
        call("Emulation.setDeviceMetricsOverride", s, width=width, height=fitted, deviceScaleFactor=1, mobile=False)
        js(s, settle)
        js(s, "shot.zoom()")
        js(s, settle)
    png = call("Page.captureScreenshot", s, format="png")["data"]
    with open(out, "wb") as f:
        f.write(base64.b64decode(png))
    print(f"window {result['lo']:.1f}-{result['hi']:.1f} ms from step {result['step']}, "
          f"selected {result['selected']}", file=sys.stderr)
    if not result["clean"]:
        print("warning: every window from step %s on has spans that overlap in a row" % step,
              file=sys.stderr)
    try:
        call("Browser.close")
    except SystemExit:
        pass
finally:
    server.shutdown()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
EOF

mkdir -p "$WORK/profile" "$(dirname "$OUT")"
log "rendering the trace in Chromium"
if ! python3 "$WORK/shot.py" "$BROWSER" "$WORK/site" "$WORK/shot.png" "$WORK/profile" \
    "$STEP" "$WINDOW_MS" "$SIZE"; then
  [ -s "$WORK/chromium.log" ] && tail -n 20 "$WORK/chromium.log" >&2
  exit 1
fi
if command -v optipng >/dev/null 2>&1; then
  optipng -quiet -o2 "$WORK/shot.png"
fi
mv "$WORK/shot.png" "$OUT"
log "wrote $OUT ($(wc -c <"$OUT") bytes)"
