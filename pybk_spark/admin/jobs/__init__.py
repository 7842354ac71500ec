"""What the spark-submit operator jobs run on: their command line and
Spark tasks, and their stdout kept for the report."""
