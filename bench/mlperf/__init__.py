"""MLPerf conventions with MLCommons' own tools (mlperf-logging):

  log.py           `:::MLLOG` lines written through mlperf_logging.mllog
  compliance.py    the package's compliance checker (training rules 5.0.0) run on a log, with
                   this project's benchmark rules (tnt_benchmarks.yaml) where MLPerf has none
"""
