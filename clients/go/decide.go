package annals

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"
)

// Retry bounds a decision's attempts: each one that conflicts waits a backoff (doubling from
// Backoff up to MaxBackoff, with jitter) before it reads and decides again.
type Retry struct {
	Attempts   int
	Backoff    time.Duration
	MaxBackoff time.Duration
}

// DefaultRetry tries a decision up to 10 times, waiting 10 ms to 1 s between tries.
var DefaultRetry = Retry{Attempts: 10, Backoff: 10 * time.Millisecond, MaxBackoff: time.Second}

// Decided is a decision's outcome: the position of its last event (0 when the command
// decided to append nothing) and the attempts it took.
type Decided struct {
	Position uint64
	Attempts int
}

// TooManyConflictsError: every attempt of a decision found that another append had changed
// what it decided on.
type TooManyConflictsError struct {
	Attempts int
}

func (e *TooManyConflictsError) Error() string {
	return fmt.Sprintf("annals: the decision's events kept changing: %d attempts, each conflicting",
		e.Attempts)
}

// Decide makes a decision within a consistency boundary: it reads the events q matches,
// folds them from initial into a state, asks command what to append given that state, and
// appends it on the condition that no event matching q was appended since the read. When
// another append got there first, it reads and decides again, as retry allows. An error of
// command is answered as it is, and nothing is appended.
func Decide[S any](ctx context.Context, c *Client, q Query, initial S,
	fold func(S, SequencedEvent) S, command func(S) ([]Event, error), retry Retry) (Decided, error) {
	attempts := max(retry.Attempts, 1)
	backoff := newBackoff(retry.Backoff, retry.MaxBackoff)
	for attempt := 1; attempt <= attempts; attempt++ {
		read, err := c.Read(ctx, q, ReadOptions{})
		if err != nil {
			return Decided{}, err
		}
		state := initial
		for _, e := range read.Events {
			state = fold(state, e)
		}
		events, err := command(state)
		if err != nil {
			return Decided{}, err
		}
		if len(events) == 0 {
			return Decided{Attempts: attempt}, nil
		}
		position, err := c.Append(ctx, events, After(q, read.Head))
		if err == nil {
			return Decided{Position: position, Attempts: attempt}, nil
		}
		if !errors.Is(err, ErrConditionFailed) {
			return Decided{}, err
		}
		if attempt < attempts && !sleep(ctx, backoff.next()) {
			return Decided{}, ctx.Err()
		}
	}
	return Decided{}, &TooManyConflictsError{Attempts: attempts}
}

// backoff doubles from first up to most, each wait drawn between half of it and all of it.
type backoff struct {
	first, most, current time.Duration
}

func newBackoff(first, most time.Duration) *backoff {
	first = max(first, time.Millisecond)
	return &backoff{first: first, most: max(most, first), current: first}
}

func (b *backoff) next() time.Duration {
	d := b.current
	b.current = min(b.current*2, b.most)
	return d/2 + rand.N(d/2+1)
}

func (b *backoff) reset() { b.current = b.first }
