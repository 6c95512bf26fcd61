"""expect(): a call must raise a given error with a one-line message holding some needles;
prints "OK <what>" then. Shared by the engine's multi-rank check programs (import it from beside them)."""


def expect(error_type, what, call, *needles):
    try:
        call()
    except error_type as error:
        text = str(error)
        missing = [needle for needle in needles if needle not in text]
        assert not missing, f"{what}: message lacks {missing}: {text}"
        assert "\n" not in text, f"{what}: message is not one line: {text!r}"
        print(f"OK {what}", flush=True)
        return text
    raise AssertionError(f"{what}: no {error_type.__name__} raised")
