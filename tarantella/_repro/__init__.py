"""The library's side of `tnt-repro` (repro/): nothing here is part of the public API.

  hook.py               the recorder tnt.Model.fit adds under `tnt-repro check` (TNT_REPRO_RECORD)
  weights.py            chunked fingerprints of every weight element, and on-the-rank differences
                        to a reference run's weights (Note [Every element compared])
  reductions.py         how many gradient reductions this process's engine performed, and which
                        strategy the trained model uses (Note [Refusing runs that distributed nothing])
  exact_reduction.py    exact mode's arithmetic (Note [Exact mode])
  exact_train_step.py   exact mode's TensorFlow train step, used by tnt.Model when
                        TNT_EXACT_VIRTUAL_BATCHES is set
"""
