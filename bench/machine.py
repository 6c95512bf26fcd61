"""The machine/software/source description of bench results; its home is tarantella/_provenance.py
(shared with tnt-repro), re-exported here under the name the bench modules import."""
from tarantella._provenance import describe_machine, describe_software, describe_source, physical_cores

__all__ = ["describe_machine", "describe_source", "describe_software", "physical_cores"]
