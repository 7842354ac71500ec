"""Messages that name their fix, against the shared real cluster: a ledger
opened with no password and with a wrong one, a misspelt log name (the
client's log open path, which Spark, the shell and jobs share), and a
DataFrame append to a raw log (the driver's check, called as Spark calls it;
no SparkSession needed)."""
import uuid

import pytest
from pyspark.sql.types import LongType, StructField, StructType

from pybk_spark import errors
from pybk_spark.logs.log import read_log
from pybk_spark.logs.log_writer import LogWriter
from pybk_spark.logs.log_reader import LogReader
from pybk_spark.spark.write_options import parse_write_options
from pybk_spark.spark.writer import prepare_log


def test_no_password_and_wrong_password_say_different_things(bk):
    lh = bk.create_ledger(3, 2, 2, password=b"secret")
    lh.add_entries([b"a"])
    lh.close()
    with pytest.raises(errors.Unauthorized) as none:
        bk.open_ledger(lh.ledger_id, recovery=False)
    assert str(none.value).startswith(
        "no password given for a ledger that has one: set the 'password' option"), none.value
    with pytest.raises(errors.Unauthorized) as wrong:
        bk.open_ledger(lh.ledger_id, password=b"guess", recovery=False)
    assert str(wrong.value).startswith("wrong password for ledger: not the one it was "
                                       "created with"), wrong.value
    assert [e.payload for e in bk.open_ledger(lh.ledger_id, password=b"secret",
                                              recovery=False).read(0, 0)] == [b"a"]


def test_a_misspelt_log_name_is_answered_with_the_closest_logs(bk):
    name = f"payments-{uuid.uuid4().hex[:6]}"
    LogWriter(bk, name).open().close()
    misspelt = name.replace("payments", "paymnets")
    with pytest.raises(errors.LogNotFound) as info:
        read_log(bk.metadata_store, misspelt)
    assert str(info.value).startswith(f"no log named {misspelt!r}; did you mean "), info.value
    assert f"'{name}'" in str(info.value)
    with pytest.raises(errors.LogNotFound, match="did you mean"):
        LogReader(bk, misspelt, "earliest")
    with pytest.raises(errors.LogNotFound) as far:
        read_log(bk.metadata_store, "q" * 40)
    assert str(far.value) == f"no log named {'q' * 40!r}"


def test_appending_a_dataframe_to_a_raw_log_names_what_is_safe(bk, metadata_uri):
    name = f"raw-{uuid.uuid4().hex[:8]}"
    w = LogWriter(bk, name).open()
    w.append_batch([b"not a dataframe"])
    w.close()
    opts = parse_write_options({"metadataServiceUri": metadata_uri, "log": name})
    schema = StructType([StructField("id", LongType())])
    with pytest.raises(errors.SchemaMismatch) as info:
        prepare_log(bk, opts, schema, False)
    message = str(info.value)
    assert "write the DataFrame to another log" in message, message
    assert "read this log as it is (spark.read: its entries as binary 'payload' rows)" in message
    assert "overwrite" not in message, message
    assert read_log(bk.metadata_store, name)[0].schema is None        # nothing changed
