"""Text classifiers on token ids: keras.io's "Bidirectional LSTM on IMDB" and "Text classification with
Transformer" (token and position embedding, attention, dropout throughout)."""
import keras
from keras import layers, ops

from zoo.data import BATCH, classes, tokens

VOCABULARY, LENGTH = 50, 12


def bidirectional_lstm(wrap):
    inputs = keras.Input(shape=(None,), dtype="int32")
    x = layers.Embedding(VOCABULARY, 8)(inputs)
    x = layers.Bidirectional(layers.LSTM(6, return_sequences=True))(x)
    x = layers.Bidirectional(layers.LSTM(6))(x)
    model = wrap(keras.Model(inputs, layers.Dense(1, activation="sigmoid")(x)))
    model.compile(optimizer="adam", loss="binary_crossentropy", metrics=["accuracy"])
    x, y = tokens(VOCABULARY, LENGTH), classes(2)
    validation = (tokens(VOCABULARY, LENGTH, n=6, seed=7), classes(2, n=6, seed=8))
    return model, model.fit(x, y, batch_size=BATCH, epochs=2, validation_data=validation, verbose=0)


class TransformerBlock(layers.Layer):
    def __init__(self, embed_dim, num_heads, ff_dim, rate=0.1):
        super().__init__()
        self.att = layers.MultiHeadAttention(num_heads=num_heads, key_dim=embed_dim)
        self.ffn = keras.Sequential([layers.Dense(ff_dim, activation="relu"), layers.Dense(embed_dim)])
        self.layernorm1 = layers.LayerNormalization(epsilon=1e-6)
        self.layernorm2 = layers.LayerNormalization(epsilon=1e-6)
        self.dropout1 = layers.Dropout(rate)
        self.dropout2 = layers.Dropout(rate)

    def call(self, inputs):
        out1 = self.layernorm1(inputs + self.dropout1(self.att(inputs, inputs)))
        return self.layernorm2(out1 + self.dropout2(self.ffn(out1)))


class TokenAndPositionEmbedding(layers.Layer):
    def __init__(self, maxlen, vocab_size, embed_dim):
        super().__init__()
        self.token_emb = layers.Embedding(input_dim=vocab_size, output_dim=embed_dim)
        self.pos_emb = layers.Embedding(input_dim=maxlen, output_dim=embed_dim)

    def call(self, x):
        positions = self.pos_emb(ops.arange(start=0, stop=ops.shape(x)[-1], step=1))
        return self.token_emb(x) + positions


def transformer_classifier(wrap):
    inputs = keras.Input(shape=(LENGTH,))
    x = TransformerBlock(8, 2, 16)(TokenAndPositionEmbedding(LENGTH, VOCABULARY, 8)(inputs))
    x = layers.Dropout(0.1)(layers.GlobalAveragePooling1D()(x))
    x = layers.Dropout(0.1)(layers.Dense(20, activation="relu")(x))
    model = wrap(keras.Model(inputs, layers.Dense(2, activation="softmax")(x)))
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    x, y = tokens(VOCABULARY, LENGTH, seed=4), classes(2, seed=5)
    validation = (tokens(VOCABULARY, LENGTH, n=6, seed=9), classes(2, n=6, seed=10))
    return model, model.fit(x, y, batch_size=BATCH, epochs=2, validation_data=validation, verbose=0)


EXAMPLES = {"bidirectional_lstm": bidirectional_lstm, "transformer_classifier": transformer_classifier}
