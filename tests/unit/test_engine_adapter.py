"""The engine adapter's pure parts, without an engine."""
from trainbase_common import engine


def test_exec_stream_demux_splits_stdout_and_stderr():
    def frame(kind, data):
        return bytes([kind, 0, 0, 0]) + len(data).to_bytes(4, "big") + data

    class Sock:
        def __init__(self, data):
            self.data = data

        def recv(self, n):
            out, self.data = self.data[:n], self.data[n:]
            return out

    out, err = engine._demux(Sock(frame(1, b"hello ") + frame(2, b"oops") + frame(1, b"world")))
    assert (out, err) == (b"hello world", b"oops")
