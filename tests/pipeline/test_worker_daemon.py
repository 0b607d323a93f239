"""``pipeline.worker_daemon``: pyspark's daemon keeps ignored stop signals ignored."""

from __future__ import annotations

import signal

from deltaflow.pipeline.worker_daemon import _KeepStopSignalsIgnored


def test_setting_a_stop_signals_handler_keeps_it_ignored_when_it_was_ignored():
    proxy = _KeepStopSignalsIgnored()
    before = {n: signal.getsignal(n) for n in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    try:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        proxy.signal(signal.SIGTERM, signal.SIG_DFL)  # what pyspark.daemon.worker() does
        proxy.signal(signal.SIGINT, signal.default_int_handler)
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_IGN
        assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN
        proxy.signal(signal.SIGHUP, signal.SIG_IGN)  # any other signal: as asked
        assert signal.getsignal(signal.SIGHUP) == signal.SIG_IGN
        # A stop signal the process does not ignore (a daemon started by another driver): as asked.
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        proxy.signal(signal.SIGTERM, signal.SIG_IGN)
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_IGN
        assert proxy.SIGTERM == signal.SIGTERM and proxy.getsignal is signal.getsignal
    finally:
        for number, handler in before.items():
            signal.signal(number, handler)
