"""The postgres-cdc source's options: where messages say the server is."""

from __future__ import annotations

from deltaflow.config.postgres import PostgresCdcOptions


def test_messages_name_the_server_libpq_connects_to_never_a_variable_name(monkeypatch):
    for name in ("PGHOST", "PGPORT", "PGDATABASE", "PGUSER"):
        monkeypatch.delenv(name, raising=False)
    given = PostgresCdcOptions(publication="p", host="db1", port=6543, database="shop")
    assert given.where() == "db1:6543/shop"
    monkeypatch.setenv("PGHOST", "db2")
    monkeypatch.setenv("PGPORT", "5433")
    monkeypatch.setenv("PGDATABASE", "orders")
    assert PostgresCdcOptions(publication="p").where() == "db2:5433/orders"
    assert PostgresCdcOptions(publication="p", port=7000).where() == "db2:7000/orders"
    for name in ("PGHOST", "PGPORT", "PGDATABASE"):
        monkeypatch.delenv(name)
    monkeypatch.setenv("PGUSER", "ana")  # libpq's database defaults to the user name
    assert PostgresCdcOptions(publication="p").where() == "[local]:5432/ana"
    assert "$" not in PostgresCdcOptions(publication="p").where()
