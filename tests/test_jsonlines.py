import io

import pytest

from exporter.peers import jsonlines


@pytest.mark.parametrize("text, message", [
    pytest.param('{"t": NaN}', "NaN is not a JSON number", id="nan"),
    pytest.param('{"t": Infinity}', "Infinity is not a JSON number", id="infinity"),
    pytest.param('{"t": 1e400}', "out of range", id="overflow"),
    pytest.param("[" * 100000 + "]" * 100000, "nested more than", id="recursion-error-in-json"),
    pytest.param("[" * 65 + "]" * 65, "nested more than 64", id="deeper-than-the-limit"),
    pytest.param("1" * 5000, "digits", id="an-integer-python-will-not-convert"),
    pytest.param(b"\xff\xfe", "not UTF-8", id="binary"),
])
def test_hostile_json_is_an_input_error_not_a_traceback(text, message):
    with pytest.raises(jsonlines.JSONInputError, match=message):
        jsonlines.loads(text)


def test_ordinary_json_reads_as_json_does():
    assert jsonlines.loads('{"t": 1.5, "ids": [1, 2], "x": [' * 1 + "[]" + "]}") == {"t": 1.5, "ids": [1, 2], "x": [[]]}
    assert jsonlines.loads("[" * 64 + "]" * 64) is not None


@pytest.mark.parametrize("value, expected", [(1, 1.0), (1.5, 1.5), (True, None), ("1", None), (10 ** 400, None), (None, None)])
def test_finite_number(value, expected):
    assert jsonlines.finite_number(value) == expected


def test_lines_bound_each_line_and_name_the_bad_ones():
    got = list(jsonlines.lines(io.BytesIO(b"ok\n\xff\xfe\n" + b"x" * 100 + b"\nlast"), max_bytes=10))
    assert got[0] == (1, "ok\n") and got[3] == (4, "last")
    assert isinstance(got[1][1], jsonlines.JSONInputError) and "UTF-8" in str(got[1][1])
    assert isinstance(got[2][1], jsonlines.JSONInputError) and "longer than 10 bytes" in str(got[2][1])
