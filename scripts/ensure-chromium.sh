#!/usr/bin/env bash
# Debian's Chromium for the HTML report's browser tests (never a downloaded browser). Installs it when this
# machine can (root, or passwordless sudo, with apt-get); otherwise says in one line why the browser tests
# will be skipped. Never fails the caller.
if [ -x /usr/bin/chromium ]; then exit 0; fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "note: no apt-get here, so Debian's chromium cannot be installed; the browser tests will be skipped"
  exit 0
fi
if [ "$(id -u)" = 0 ]; then SUDO=""
elif sudo -n true 2>/dev/null; then SUDO="sudo -n"
else
  echo "note: installing chromium needs root (sudo apt-get install chromium); the browser tests will be skipped"
  exit 0
fi
echo "installing Debian's chromium for the browser tests (once)"
if ! ($SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium >/dev/null); then
  echo "note: apt-get could not install chromium; the browser tests will be skipped"
fi
exit 0
