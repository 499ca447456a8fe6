"""labkit.teaching.quiz: checks that pass for the computed answer and fail, with a reason, otherwise."""
import pytest

from labkit.teaching import quiz


def q(**kw):
    base = dict(id="t-q1", prompt="extra time for a 30% drop?", answer=1 / 0.7 - 1,
                explanation="1/(1-d) - 1", mistakes={0.30: "that is the drop itself"})
    base.update(kw)
    return quiz.Question(**base)


def test_correct_within_tolerance(capsys):
    ok = quiz.check(q(), 0.43)          # a learner's check prints (inside an assert it would be silent)
    assert ok is True
    out = capsys.readouterr().out
    assert "correct" in out and "why: 1/(1-d) - 1" in out


def test_unanswered_is_not_an_error(capsys):
    assert quiz.check(q(), None) is False
    assert "not answered yet" in capsys.readouterr().out


@pytest.mark.parametrize("value, words", [
    (0.30, "common mistake: that is the drop itself"),
    (43.0, "percentage"),
    (0.6, "too high by 40%"),
    (0.2, "too low"),
    (4.2857, "factor of 10^1"),
    (-0.43, "wrong sign"),
    ("lots", "expected a number"),
])
def test_wrong_numbers_say_why(value, words, capsys):
    ok = quiz.check(q(), value)
    assert ok is False
    assert words in capsys.readouterr().out


def test_fraction_given_for_percentage():
    fb = quiz.evaluate(q(answer=42.857), 0.42857)
    assert fb.status == "wrong" and "fraction" in fb.message


def test_strings_and_choices():
    qq = quiz.Question("t-q2", "which family?", "communication",
                       choices=("compute", "communication", "memory", "data", "scheduling"),
                       mistakes={"compute": "MFU is fine here"})
    assert quiz.evaluate(qq, "  Communication ").ok
    assert "MFU is fine" in quiz.evaluate(qq, "compute").message
    assert "not one of the options" in quiz.evaluate(qq, "network").message
    assert "not the answer" in quiz.evaluate(qq, "memory").message
    assert "expected a word" in quiz.evaluate(qq, 3).message


def test_booleans():
    qq = quiz.Question("t-q3", "does recompute count in MFU?", False)
    assert quiz.evaluate(qq, False).ok and quiz.evaluate(qq, "no").ok
    assert not quiz.evaluate(qq, True).ok
    assert "True or False" in quiz.evaluate(qq, 3).message


def test_zero_answer_uses_tol_abs():
    qq = quiz.Question("t-q4", "zero?", 0.0, tol_abs=1e-3)
    assert quiz.evaluate(qq, 5e-4).ok
    assert "too high" in quiz.evaluate(qq, 0.1).message


def test_bad_questions_rejected():
    with pytest.raises(ValueError, match="answer is None"):
        quiz.Question("x", "p", None)
    with pytest.raises(ValueError, match="tol_rel"):
        quiz.Question("x", "p", 1.0, tol_rel=2)
    with pytest.raises(ValueError, match="not one of choices"):
        quiz.Question("x", "p", "gpu", choices=("cpu",))
    with pytest.raises(TypeError, match="number, str or bool"):
        quiz.Question("x", "p", [1])
    with pytest.raises(ValueError, match="finite"):
        quiz.Question("x", "p", float("nan"))
    with pytest.raises(TypeError, match="Question"):
        quiz.check("not a question", 1)


def test_check_all_scores(capsys):
    a, b = q(), quiz.Question("t-q5", "b", 2.0)
    res = quiz.check_all([a, b], {"t-q1": 0.43})
    assert res == {"t-q1": True, "t-q5": False}
    assert "score: 1/2" in capsys.readouterr().out
    with pytest.raises(ValueError, match="not questions here"):
        quiz.check_all([a], {"nope": 1})


def test_show_and_markdown(capsys):
    qq = quiz.Question("t-q6", "pick", "a", choices=("a", "b"), unit="")
    qq.show()
    assert "[t-q6] pick  (one of: a, b)" in capsys.readouterr().out
    assert qq._repr_markdown_().startswith("**[t-q6]**")


def test_prediction_compares_guess_with_measurement(capsys):
    p = quiz.Prediction("t-p1", "speed-up of 2 ranks?", unit="×")
    p.show()
    assert "[t-p1] Predict before you measure: speed-up of 2 ranks?  [unit: ×]" in capsys.readouterr().out
    assert p.reveal(1.8, actual=1.6, why="shared cores") is None and p.evaluate(1.8, 1.6).ok   # 12.5 % high
    out = capsys.readouterr().out
    assert "you predicted 1.8 ×, measured 1.6 ×: 12% too high — a good prediction" in out and "why: shared cores" in out
    p.reveal(2.0, actual=1.2)                                             # 67 % high
    assert "67% too high — your model of the system missed something" in capsys.readouterr().out
    assert p.evaluate(0.5, 1.0).message.startswith("you predicted 0.5 ×, measured 1 ×: 50% too low")
    assert p.evaluate(None, 1.0).status == "unanswered"
    assert p.evaluate("fast", 1.0).status == "wrong"
    assert p.evaluate(0.1, 0.0).ok and not p.evaluate(0.5, 0.0).ok          # absolute when measured is 0


def test_bad_predictions_rejected():
    with pytest.raises(ValueError, match="tol_rel"):
        quiz.Prediction("x", "p", tol_rel=0)
    with pytest.raises(ValueError, match="non-empty"):
        quiz.Prediction("", "p")
    with pytest.raises(ValueError, match="basis='guessed' is not valid"):
        quiz.Prediction("x", "p", basis="guessed")
    assert "modelled 2" in quiz.Prediction("x", "p", basis="modelled").evaluate(1.0, 2.0).message
    with pytest.raises(ValueError, match="actual must be a finite number"):
        quiz.Prediction("x", "p").evaluate(1.0, float("nan"))


def test_a_notebooks_own_verification_reveals_nothing(capsys):
    """Run All must not print the answers under unanswered questions (issue #34: ch29's last cell printed
    '✔ correct (0.7222…)'): inside an assert, and through verify, a check is silent; the learner's own check
    still prints its feedback and explanation."""
    import linecache

    q = quiz.Question("t-q", "2+2?", answer=4, explanation="SECRET-WHY", mistakes={5: "off by one"})
    cell = ("assert quiz.check(q, 4) and not quiz.check(\n"
            "    q, 5)\n"
            "ok = quiz.check(q, 4)\n")
    name = "<notebook-cell-test>"
    linecache.cache[name] = (len(cell), None, cell.splitlines(True), name)   # as IPython registers a cell
    try:
        env = {"quiz": quiz, "q": q}
        exec(compile(cell.split("ok =")[0], name, "exec"), env)
        assert capsys.readouterr().out == ""                                  # the assert revealed nothing
        exec(compile(cell, name, "exec"), env)
        out = capsys.readouterr().out
        assert env["ok"] is True and out.count("correct (4; expected 4)") == 1 and out.count("SECRET-WHY") == 1
    finally:
        linecache.cache.pop(name, None)
    assert quiz.verify(q, 4) and not quiz.verify(q, 5) and not quiz.verify(q, None)
    assert capsys.readouterr().out == ""
