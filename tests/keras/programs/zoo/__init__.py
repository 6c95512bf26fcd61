"""Models written after keras.io's examples (issue 22 §2), each as a function `example(wrap)`.

Each builds its model as keras.io does, applies `wrap` where a user adds the one line
`model = tnt.Model(model)` (the identity for the serial run), compiles and fits on synthetic data of the
example's real structure, and returns (model, history). programs/keras_io_zoo.py runs each serially and
wrapped, and compares the two element by element.
"""
from zoo import generative, learning, outputs, structured, text, vision

EXAMPLES = {**generative.EXAMPLES, **learning.EXAMPLES, **vision.EXAMPLES, **text.EXAMPLES,
            **structured.EXAMPLES, **outputs.EXAMPLES}
