package annals

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"iter"
	"net/http"
	"strconv"
	"time"
)

// Subscribe answers the events q matches appended after position after: those already in
// the log, then each new one as it is appended, in order, for as long as ctx lives. A dropped
// connection (the server restarting, the network) is taken up again from the last event
// delivered, after a backoff, so no event is missed or delivered twice; a refusal (a bad
// query, a missing key) ends the subscription with its error, and so does ctx's end.
//
//	for e, err := range client.Subscribe(ctx, annals.Tags("course:c1"), 0) {
//		if err != nil { ... }
//	}
func (c *Client) Subscribe(ctx context.Context, q Query, after uint64) iter.Seq2[SequencedEvent, error] {
	return func(yield func(SequencedEvent, error) bool) {
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		last := after
		backoff := newBackoff(100*time.Millisecond, 5*time.Second)
		for {
			delivered, err := c.follow(ctx, q, &last, yield)
			if errors.Is(err, errStopped) {
				return
			}
			if ctx.Err() != nil {
				yield(SequencedEvent{}, ctx.Err())
				return
			}
			var refused *Error
			if errors.As(err, &refused) && !errors.Is(refused, ErrUnavailable) {
				yield(SequencedEvent{}, err)
				return
			}
			// Dropped, unreachable or unavailable for now: take it up again from `last`.
			if delivered {
				backoff.reset()
			}
			if !sleep(ctx, backoff.next()) {
				yield(SequencedEvent{}, ctx.Err())
				return
			}
		}
	}
}

var errStopped = errors.New("the consumer stopped")

// follow reads one connection's stream, moving *last past each event delivered; answers
// whether any was, and why the stream ended.
func (c *Client) follow(ctx context.Context, q Query, last *uint64,
	yield func(SequencedEvent, error) bool) (bool, error) {
	params, err := queryParams(q)
	if err != nil {
		return false, err
	}
	params.Set("after", strconv.FormatUint(*last, 10))
	resp, err := c.do(ctx, http.MethodGet, "/v1/subscribe", params, nil, "application/x-ndjson")
	if err != nil {
		return false, err
	}
	defer resp.Body.Close()
	reader := bufio.NewReaderSize(resp.Body, 64<<10)
	delivered := false
	for {
		line, err := reader.ReadBytes('\n')
		if err != nil {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return delivered, &UnreachableError{URL: c.base.String(), Err: err}
		}
		var w wireEvent
		if err := json.Unmarshal(line, &w); err != nil {
			return delivered, &UnreachableError{URL: c.base.String(), Err: err}
		}
		e, err := fromWire(w)
		if err != nil {
			return delivered, err
		}
		if e.Position <= *last {
			continue // already delivered before the connection dropped
		}
		*last = e.Position
		delivered = true
		if !yield(e, nil) {
			return delivered, errStopped
		}
	}
}

// sleep waits d, or less if ctx ends first (then answers false).
func sleep(ctx context.Context, d time.Duration) bool {
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-timer.C:
		return true
	}
}
