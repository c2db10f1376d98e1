#!/usr/bin/env bash
# Debian's Chromium for the HTML report's browser tests (never a downloaded browser). Installs it when this
# machine can (root, or passwordless sudo, with apt-get). When /usr/bin/chromium is still missing it says in one
# line why and exits 1, since the browser tests then fail; with ONNXPORT_SKIP_BROWSER=1 it notes that they
# will be skipped and exits 0.
if [ -x /usr/bin/chromium ]; then exit 0; fi
if [ "${ONNXPORT_SKIP_BROWSER:-}" = 1 ]; then
  echo "note: ONNXPORT_SKIP_BROWSER=1 and no /usr/bin/chromium: the browser tests will be skipped"
  exit 0
fi
fail() {
  echo "error: $1; install it (apt-get install chromium) or set ONNXPORT_SKIP_BROWSER=1 to skip the browser tests" >&2
  exit 1
}
if ! command -v apt-get >/dev/null 2>&1; then
  fail "no /usr/bin/chromium and no apt-get here to install Debian's chromium"
fi
if [ "$(id -u)" = 0 ]; then SUDO=""
elif sudo -n true 2>/dev/null; then SUDO="sudo -n"
else
  fail "no /usr/bin/chromium, and installing it needs root (sudo apt-get install chromium)"
fi
echo "installing Debian's chromium for the browser tests (once)"
if ! ($SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium >/dev/null); then
  fail "apt-get could not install chromium"
fi
if [ ! -x /usr/bin/chromium ]; then
  fail "apt-get installed chromium, but there is no /usr/bin/chromium"
fi
exit 0
