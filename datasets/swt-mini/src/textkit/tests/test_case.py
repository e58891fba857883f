from textkit import (
    camel_case,
    constant_case,
    kebab_case,
    pascal_case,
    snake_case,
    split_words,
)


def test_split_words_on_separators():
    assert split_words("hello world-foo_bar") == ["hello", "world", "foo", "bar"]


def test_split_words_keeps_acronyms_together():
    assert split_words("parseHTTPResponse") == ["parse", "HTTP", "Response"]


def test_split_words_digits():
    assert split_words("version2Update") == ["version", "2", "Update"]


def test_snake_case():
    assert snake_case("Parse HTTP response") == "parse_http_response"


def test_snake_case_empty():
    assert snake_case("") == ""


def test_kebab_case():
    assert kebab_case("someValueName") == "some-value-name"


def test_constant_case():
    assert constant_case("max retry count") == "MAX_RETRY_COUNT"


def test_pascal_case():
    assert pascal_case("user_account_id") == "UserAccountId"


def test_camel_case():
    assert camel_case("user_account_id") == "userAccountId"


def test_camel_case_from_pascal():
    assert camel_case("HTTPServerError") == "httpServerError"
