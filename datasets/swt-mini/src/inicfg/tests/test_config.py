import os
import tempfile
import unittest

from inicfg import Config

SAMPLE = """
[server]
host = example.org
port = 8080
timeout = 2.5
debug = yes
verbose = off
hosts =
    one.example
    two.example
paths = /usr/lib|/opt/lib

[Client]
Retries = 3
"""


class TestGetters(unittest.TestCase):
    def setUp(self):
        self.cfg = Config.from_string(SAMPLE)

    def test_sections(self):
        self.assertEqual(self.cfg.sections(), ["server", "Client"])

    def test_get(self):
        self.assertEqual(self.cfg.get("server", "host"), "example.org")

    def test_keys_are_case_insensitive(self):
        self.assertEqual(self.cfg.get("server", "HOST"), "example.org")
        self.assertEqual(self.cfg.getint("Client", "retries"), 3)

    def test_getint(self):
        self.assertEqual(self.cfg.getint("server", "port"), 8080)

    def test_getfloat(self):
        self.assertEqual(self.cfg.getfloat("server", "timeout"), 2.5)

    def test_getboolean(self):
        self.assertIs(self.cfg.getboolean("server", "debug"), True)
        self.assertIs(self.cfg.getboolean("server", "verbose"), False)

    def test_getint_invalid(self):
        with self.assertRaises(ValueError):
            self.cfg.getint("server", "host")

    def test_missing_option_raises(self):
        with self.assertRaises(KeyError):
            self.cfg.get("server", "user")

    def test_missing_option_fallback(self):
        self.assertEqual(self.cfg.get("server", "user", fallback="nobody"), "nobody")
        self.assertEqual(self.cfg.getint("server", "workers", fallback=4), 4)

    def test_has_option(self):
        self.assertTrue(self.cfg.has_option("server", "Port"))
        self.assertFalse(self.cfg.has_option("server", "user"))
        self.assertFalse(self.cfg.has_option("nowhere", "port"))


class TestLists(unittest.TestCase):
    def setUp(self):
        self.cfg = Config.from_string(SAMPLE)

    def test_getlist_multiline(self):
        self.assertEqual(self.cfg.getlist("server", "hosts"), ["one.example", "two.example"])

    def test_getlist_custom_separator(self):
        self.assertEqual(self.cfg.getlist("server", "paths", sep="|"), ["/usr/lib", "/opt/lib"])

    def test_getlist_fallback(self):
        self.assertEqual(self.cfg.getlist("server", "extra", fallback=[]), [])


class TestFiles(unittest.TestCase):
    def test_from_file(self):
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "app.ini")
            with open(path, "w", encoding="utf-8") as handle:
                handle.write("[app]\nname = demo\n")
            cfg = Config.from_file(path)
        self.assertEqual(cfg.get("app", "name"), "demo")


if __name__ == "__main__":
    unittest.main()
