import textwrap
import unittest

from inicfg import ParseError, parse


def dedent(text):
    return textwrap.dedent(text).lstrip("\n")


class TestParse(unittest.TestCase):
    def test_sections_and_options(self):
        data = parse(dedent("""
            [server]
            host = example.org
            port = 8080

            [client]
            retries: 3
        """))
        self.assertEqual(data, {
            "server": {"host": "example.org", "port": "8080"},
            "client": {"retries": "3"},
        })

    def test_keys_are_lowercased(self):
        data = parse("[s]\nMaxSize = 10\n")
        self.assertEqual(data["s"], {"maxsize": "10"})

    def test_section_names_keep_case(self):
        self.assertIn("Server", parse("[Server]\na = 1\n"))

    def test_comment_lines_are_ignored(self):
        data = parse(dedent("""
            # leading comment
            [s]
            ; another comment
            a = 1
        """))
        self.assertEqual(data, {"s": {"a": "1"}})

    def test_inline_comment(self):
        data = parse("[s]\nport = 8080   ; default port\n")
        self.assertEqual(data["s"]["port"], "8080")

    def test_empty_value(self):
        self.assertEqual(parse("[s]\nname =\n")["s"]["name"], "")

    def test_continuation_lines(self):
        data = parse(dedent("""
            [s]
            hosts =
                one.example
                two.example
            after = x
        """))
        self.assertEqual(data["s"]["hosts"], "one.example\ntwo.example")
        self.assertEqual(data["s"]["after"], "x")

    def test_equals_sign_in_value(self):
        data = parse("[s]\nexpr = a=b\n")
        self.assertEqual(data["s"]["expr"], "a=b")


class TestErrors(unittest.TestCase):
    def test_option_outside_section(self):
        with self.assertRaises(ParseError):
            parse("a = 1\n")

    def test_missing_separator(self):
        with self.assertRaises(ParseError):
            parse("[s]\njust some words\n")

    def test_unterminated_header(self):
        with self.assertRaises(ParseError):
            parse("[s\na = 1\n")

    def test_duplicate_section(self):
        with self.assertRaises(ParseError):
            parse("[s]\na = 1\n[s]\nb = 2\n")

    def test_error_keeps_offending_line(self):
        with self.assertRaises(ParseError) as ctx:
            parse("[s]\na = 1\noops\n")
        self.assertEqual(ctx.exception.line, "oops")

    def test_parse_error_is_value_error(self):
        self.assertTrue(issubclass(ParseError, ValueError))


if __name__ == "__main__":
    unittest.main()
