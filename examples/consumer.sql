-- The projection of examples/consumer.ts, in SQL: any client that can send
-- these statements consumes with the same guarantees, and here it goes on
-- from the same cursor. read_page locks the cursor and returns the next
-- events below safe_seq; advance_cursor moves the cursor in the page's own
-- transaction, so the totals and the cursor commit together. Each run is one
-- page: run it again for the next.
-- Run: psql "$DATABASE_URL" -v ON_ERROR_STOP=1 -f examples/consumer.sql
BEGIN ISOLATION LEVEL REPEATABLE READ;
WITH page AS (
  SELECT * FROM tidemark.read_page('order-totals', 'orders', 100)
), applied AS (
  INSERT INTO order_totals (customer, total)
  SELECT key, sum((payload->>'total')::numeric) FROM page GROUP BY key
  ON CONFLICT (customer) DO UPDATE SET total = order_totals.total + excluded.total
)
SELECT count(*) AS events, tidemark.advance_cursor('order-totals', 'orders', max(seq)) AS cursor FROM page;
COMMIT;
