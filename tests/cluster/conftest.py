from tests.cluster.netns_fixture import netns_cluster  # noqa: F401  (the fixture)
