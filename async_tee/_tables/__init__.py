"""The tables: one meter's instruments and the values they report, async_tee's own series."""
