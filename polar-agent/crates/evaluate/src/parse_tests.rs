//! Tests of the test-output parsers on hand-written output in the shape of
//! real `pytest -rA`, `pytest -v` (with xdist and colour) and `python -m
//! unittest -v` runs, and a property test that no input makes them panic.

use proptest::prelude::*;

use super::*;

use TestStatus::*;

const PYTEST_RA: &str = "\
============================= test session starts ==============================
platform linux -- Python 3.11.8, pytest-8.1.1, pluggy-1.4.0
rootdir: /repo
configfile: pyproject.toml
collected 11 items

tests/test_parser.py ..F.sxXF                                            [ 72%]
tests/test_unicode.py .E.                                                [100%]

==================================== ERRORS ====================================
______________________ ERROR at setup of test_db_fixture _______________________

    @pytest.fixture
    def db():
>       raise RuntimeError(\"no database\")
E       RuntimeError: no database

tests/test_unicode.py:20: RuntimeError
=================================== FAILURES ===================================
_______________________________ test_parse[a-b] ________________________________

x = 'a-b'

    @pytest.mark.parametrize(\"x\", [\"1-2\", \"a-b\"])
    def test_parse(x):
>       assert parse(x) == x.split(\"-\")
E       AssertionError: assert ['a'] == ['a', 'b']

tests/test_parser.py:14: AssertionError
------------------------------ Captured log call -------------------------------
ERROR    parser:parser.py:42 could not parse 'a-b'
WARNING  parser:parser.py:43 falling back
==================================== PASSES ====================================
_________________________________ test_simple __________________________________
----------------------------- Captured stdout call -----------------------------
PASSED looks like a status but is the test's own print
=========================== short test summary info ============================
PASSED tests/test_parser.py::test_simple
PASSED tests/test_parser.py::test_parse[1-2]
PASSED tests/test_parser.py::TestClass::test_method
PASSED tests/test_unicode.py::test_ünïcödé[naïve café]
PASSED tests/test_unicode.py::test_db_teardown
SKIPPED [1] tests/test_parser.py:50: needs network
SKIPPED [1] tests/test_parser.py::test_skipped_verbose: no GPU
XFAIL tests/test_parser.py::test_known_bug - reason: issue 123
XPASS tests/test_parser.py::test_flaky_xfail
ERROR tests/test_unicode.py::test_db_fixture - RuntimeError: no database
ERROR tests/test_unicode.py::test_db_teardown - OSError: [Errno 2] gone
FAILED tests/test_parser.py::test_parse[a-b] - AssertionError: assert ['a'] == ['a', 'b']
FAILED tests/test_parser.py::test_spaces[x - y-[1]] - ValueError: bad [x]
= 2 failed, 5 passed, 2 skipped, 1 xfailed, 1 xpassed, 2 errors in 0.12s =
";

#[test]
fn pytest_ra_summary() {
    let got = pytest(PYTEST_RA);
    let want: TestOutcomes = [
        ("tests/test_parser.py::test_simple", Passed),
        ("tests/test_parser.py::test_parse[1-2]", Passed),
        ("tests/test_parser.py::TestClass::test_method", Passed),
        ("tests/test_unicode.py::test_ünïcödé[naïve café]", Passed),
        // PASSED in the call, ERROR in teardown: the worst wins.
        ("tests/test_unicode.py::test_db_teardown", Error),
        ("tests/test_parser.py::test_skipped_verbose", Skipped),
        ("tests/test_parser.py::test_known_bug", XFail),
        ("tests/test_parser.py::test_flaky_xfail", XPass),
        ("tests/test_unicode.py::test_db_fixture", Error),
        ("tests/test_parser.py::test_parse[a-b]", Failed),
        ("tests/test_parser.py::test_spaces[x - y-[1]]", Failed),
    ]
    .into_iter()
    .map(|(n, s)| (n.to_owned(), s))
    .collect();
    assert_eq!(got, want);
}

#[test]
fn pytest_collection_error_names_the_file() {
    let out = "\
==================================== ERRORS ====================================
____________________ ERROR collecting tests/test_broken.py _____________________
ImportError while importing test module '/repo/tests/test_broken.py'.
E   ModuleNotFoundError: No module named 'missing'
=========================== short test summary info ============================
ERROR tests/test_broken.py
ERROR tests/test_other.py - SyntaxError: invalid syntax
!!!!!!!!!!!!!!!!!!!! Interrupted: 2 errors during collection !!!!!!!!!!!!!!!!!!!!
";
    let got = pytest(out);
    assert_eq!(got.len(), 2, "{got:?}");
    assert_eq!(got["tests/test_broken.py"], Error);
    assert_eq!(got["tests/test_other.py"], Error);
}

#[test]
fn pytest_verbose_xdist_and_colour() {
    let out = "\
\u{1b}[1m============================= test session starts ==============================\u{1b}[0m
created: 2/2 workers
tests/test_a.py::test_one \u{1b}[32mPASSED\u{1b}[0m\u{1b}[32m                                     [ 25%]\u{1b}[0m
tests/test_a.py::test_two[x-1] FAILED                                    [ 50%]
tests/test_a.py::test_skip SKIPPED (no network)                          [ 62%]
tests/test_a.py::test_xf XFAIL (known)                                   [ 75%]
[gw0] [ 87%] PASSED tests/test_b.py::TestK::test_k[ß-∂]
[gw1] [100%] ERROR tests/test_b.py::test_fixture
tests/test_c.py::test_rerun RERUN                                        [ 90%]
tests/test_c.py::test_rerun PASSED                                       [100%]
";
    let got = pytest(out);
    assert_eq!(got["tests/test_a.py::test_one"], Passed);
    assert_eq!(got["tests/test_a.py::test_two[x-1]"], Failed);
    assert_eq!(got["tests/test_a.py::test_skip"], Skipped);
    assert_eq!(got["tests/test_a.py::test_xf"], XFail);
    assert_eq!(got["tests/test_b.py::TestK::test_k[ß-∂]"], Passed);
    assert_eq!(got["tests/test_b.py::test_fixture"], Error);
    assert_eq!(got["tests/test_c.py::test_rerun"], Passed);
    assert_eq!(got.len(), 7, "{got:?}");
}

#[test]
fn pytest_ignores_text_that_only_resembles_results() {
    let out = "\
ERROR    root:conftest.py:3 something logged
PASSED
FAILED  two spaces
PASSED no_colons_here
INFO tests/test_a.py::test_one
tests/test_a.py::test_one is PASSED
";
    assert_eq!(pytest(out), TestOutcomes::new());
}

const UNITTEST_V: &str = "\
test_add (test_math.TestMath.test_add) ... ok
test_div_zero (test_math.TestMath.test_div_zero) ... FAIL
test_import (test_math.TestMath.test_import) ... ERROR
test_network (test_math.TestMath.test_network) ... skipped 'no network'
test_known (test_math.TestMath.test_known) ... expected failure
test_surprise (test_math.TestMath.test_surprise) ... unexpected success
test_docstring (test_math.TestMath.test_docstring)
Adds numbers, and says so ... in its docstring. ... ok
test_prints (test_math.TestMath.test_prints) ... hello from the test
loading ... done
ok
test_ünïcode (test_math.TestÜnï.test_ünïcode) ... ok
test_subtests (test_math.TestMath.test_subtests) ... 
======================================================================
ERROR: test_import (test_math.TestMath.test_import)
----------------------------------------------------------------------
Traceback (most recent call last):
  File \"/repo/test_math.py\", line 20, in test_import
    import missing
ModuleNotFoundError: No module named 'missing'

======================================================================
FAIL: test_div_zero (test_math.TestMath.test_div_zero)
----------------------------------------------------------------------
AssertionError: 1 != 2

======================================================================
FAIL: test_subtests (test_math.TestMath.test_subtests) (i=2)
----------------------------------------------------------------------
AssertionError: 2 != 3

----------------------------------------------------------------------
Ran 10 tests in 0.004s

FAILED (failures=2, errors=1, skipped=1, expected failures=1, unexpected successes=1)
";

#[test]
fn unittest_verbose() {
    let got = unittest(UNITTEST_V);
    let want: TestOutcomes = [
        ("test_math.TestMath.test_add", Passed),
        ("test_math.TestMath.test_div_zero", Failed),
        ("test_math.TestMath.test_import", Error),
        ("test_math.TestMath.test_network", Skipped),
        ("test_math.TestMath.test_known", XFail),
        ("test_math.TestMath.test_surprise", XPass),
        ("test_math.TestMath.test_docstring", Passed),
        ("test_math.TestMath.test_prints", Passed),
        ("test_math.TestÜnï.test_ünïcode", Passed),
        ("test_math.TestMath.test_subtests", Failed),
    ]
    .into_iter()
    .map(|(n, s)| (n.to_owned(), s))
    .collect();
    assert_eq!(got, want);
}

#[test]
fn unittest_old_form_and_django() {
    let out = "\
Creating test database for alias 'default'...
test_add (test_math.TestMath) ... ok
test_div (test_math.TestMath) ... FAIL
test_view (admin_views.tests.AdminViewBasicTest) ... skipped 'Requires DB'
ERROR: setUpClass (admin_views.tests.BrokenTest)
Destroying test database for alias 'default'...
";
    let got = unittest(out);
    assert_eq!(got["test_math.TestMath.test_add"], Passed);
    assert_eq!(got["test_math.TestMath.test_div"], Failed);
    assert_eq!(
        got["admin_views.tests.AdminViewBasicTest.test_view"],
        Skipped
    );
    assert_eq!(got["admin_views.tests.BrokenTest.setUpClass"], Error);
    assert_eq!(got.len(), 4);
}

#[test]
fn unittest_names_in_any_spelling_are_canonical() {
    let p = Parser::Unittest;
    for given in [
        "test_add (test_math.TestMath)",
        "test_add (test_math.TestMath.test_add)",
        "test_math.TestMath.test_add",
        "  test_math.TestMath.test_add ",
    ] {
        assert_eq!(
            p.canonical_name(given),
            "test_math.TestMath.test_add",
            "{given}"
        );
    }
    assert_eq!(
        Parser::Pytest.canonical_name("t.py::x[a b]"),
        "t.py::x[a b]"
    );
}

#[test]
fn regex_parser_uses_the_name_group_and_the_worst_status() {
    let pass = Regex::new(r"^ok \d+ - (?P<name>.+)$").unwrap();
    let fail = Regex::new(r"^not ok \d+ - (?P<name>.+)$").unwrap();
    let out = "\
TAP version 13
1..4
ok 1 - parses numbers
not ok 2 - parses ünïcode
ok 3 - flaky
not ok 4 - flaky
";
    let got = regex(out, &pass, Some(&fail));
    assert_eq!(got["parses numbers"], Passed);
    assert_eq!(got["parses ünïcode"], Failed);
    assert_eq!(got["flaky"], Failed);
    assert_eq!(got.len(), 3);
    let passes_only = regex(out, &pass, None);
    assert_eq!(passes_only.len(), 2);
}

#[test]
fn nodeids_split_at_their_brackets() {
    assert_eq!(
        split_nodeid("a::b[x - y] - msg"),
        Some(("a::b[x - y]", " - msg"))
    );
    assert_eq!(split_nodeid("a::b[[1]]"), Some(("a::b[[1]]", "")));
    assert_eq!(
        split_nodeid("a::b[unclosed - msg"),
        Some(("a::b[unclosed", " - msg"))
    );
    assert_eq!(split_nodeid(" x"), None);
}

fn vocabulary() -> impl Strategy<Value = String> {
    let pieces = prop::sample::select(vec![
        "PASSED ",
        "FAILED ",
        "ERROR ",
        "SKIPPED ",
        "XFAIL ",
        "XPASS ",
        "[gw0] ",
        "[ 50%] ",
        "[",
        "]",
        "[1] ",
        "::",
        " - ",
        " ... ",
        " ...",
        "ok",
        "FAIL: ",
        "ERROR: ",
        " (",
        ")",
        ") (",
        "t.py",
        "test_x",
        "m.C.test_x",
        ".",
        ":",
        "\n",
        " ",
        "é",
        "\u{1b}[32m",
        "\u{1b}",
        "skipped",
        "expected failure",
    ]);
    prop::collection::vec(pieces, 0..40).prop_map(|v| v.concat())
}

proptest! {
    #[test]
    fn parsers_never_panic_on_arbitrary_text(text in any::<String>()) {
        let pass = Regex::new(r"(?P<name>\w+) ok").unwrap();
        let _ = pytest(&text);
        let _ = unittest(&text);
        let _ = regex(&text, &pass, Some(&pass));
        let _ = Parser::Unittest.canonical_name(&text);
    }

    #[test]
    fn parsers_never_panic_on_result_like_text(text in vocabulary()) {
        for (name, status) in pytest(&text).into_iter().chain(unittest(&text)) {
            prop_assert!(!name.is_empty());
            prop_assert!(name.trim() == name, "{name:?} {status:?}");
        }
    }
}
