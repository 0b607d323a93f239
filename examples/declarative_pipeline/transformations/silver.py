"""A bronze Delta table streamed into a silver one by deltaflow: the `deltaflow-delta` source and
the `deltaflow` sink are found by pyspark itself (no register call), each batch is one Delta
commit with txn(pipeline_id, batch id), and the pipeline's storage keeps the checkpoint."""

from pyspark import pipelines as dp
from pyspark.sql import SparkSession
from pyspark.sql import functions as F  # noqa: N812

spark = SparkSession.active()
source = spark.conf.get("deltaflow.example.source")
target = spark.conf.get("deltaflow.example.target")

dp.create_sink(
    "silver",
    format="deltaflow",
    options={"table_uri": target, "pipeline_id": "silver-from-bronze", "partition_columns": '["day"]'},
)


@dp.append_flow(target="silver")
def bronze_to_silver():
    return (
        spark.readStream.format("deltaflow-delta")
        .load(source)
        .where(F.col("amount") > 0)
        .withColumn("day", F.to_date("at").cast("string"))
    )
