"""Validating the simulation out of sample (`tnt-bench validate`).

    this_machine.py   a measured sweep's 2 and 4 ranks predicted from its 1-rank data only
    published.py      published scaling results of other systems (Horovod's benchmark)
    applications.py   gradient timelines of the Keras applications those results used
    record.py         what every validation writes: the profile's contents and hash, errors
"""
