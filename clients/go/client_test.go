package annals_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"annals"
)

// server is the Annals server the tests run against: ANNALS_URL, started by the project's
// test command (crates/annals-cli/tests/clients.rs) on segment files or on PostgreSQL.
func server(t *testing.T) *annals.Client {
	t.Helper()
	url := os.Getenv("ANNALS_URL")
	if url == "" {
		t.Skip("ANNALS_URL names no server (the project's test command starts one)")
	}
	client, err := annals.New(url)
	if err != nil {
		t.Fatal(err)
	}
	return client
}

// unique makes a tag no other test (or earlier run against the same server) uses.
func unique(prefix string) string {
	return fmt.Sprintf("%s:%x", prefix, rand.Uint64())
}

func context10s(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestAppendAndReadAsOptionsSay(t *testing.T) {
	client, ctx := server(t), context10s(t)
	tag := unique("order")
	var positions []uint64
	for i := range 5 {
		p, err := client.Append(ctx, []annals.Event{{
			Type: "Placed",
			Tags: []string{tag, fmt.Sprintf("n:%d", i)},
			Data: []byte(fmt.Sprintf(`{"n":%d}`, i)),
		}}, nil)
		if err != nil {
			t.Fatal(err)
		}
		positions = append(positions, p)
	}
	read, err := client.Read(ctx, annals.Tags(tag), annals.ReadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(read.Events) != 5 || read.Head < positions[4] {
		t.Fatalf("read %d events, head %d", len(read.Events), read.Head)
	}
	for i, e := range read.Events {
		if e.Position != positions[i] || e.Type != "Placed" || string(e.Data) != fmt.Sprintf(`{"n":%d}`, i) {
			t.Fatalf("event %d: %+v", i, e)
		}
		if e.AppendedAt.IsZero() || time.Since(e.AppendedAt) > time.Minute {
			t.Fatalf("event %d appended at %v", i, e.AppendedAt)
		}
	}
	back, err := client.Read(ctx, annals.Tags(tag), annals.ReadOptions{Backwards: true, Limit: 2})
	if err != nil || len(back.Events) != 2 || back.Events[0].Position != positions[4] {
		t.Fatalf("backwards: %+v %v", back, err)
	}
	after, err := client.Read(ctx, annals.Tags(tag), annals.ReadOptions{After: &positions[2]})
	if err != nil || len(after.Events) != 2 || after.Events[0].Position != positions[3] {
		t.Fatalf("after: %+v %v", after, err)
	}
	from, err := client.Read(ctx, annals.Tags(tag), annals.ReadOptions{From: &positions[2], Limit: 1})
	if err != nil || len(from.Events) != 1 || from.Events[0].Position != positions[2] {
		t.Fatalf("from: %+v %v", from, err)
	}
	// Types OR-ed within an item, tags AND-ed, items OR-ed.
	both := annals.Query{Items: []annals.QueryItem{{Types: []string{"Placed", "Other"}, Tags: []string{tag, "n:1"}}}}
	one, err := client.Read(ctx, both.Or(annals.QueryItem{Tags: []string{tag, "n:3"}}), annals.ReadOptions{})
	if err != nil || len(one.Events) != 2 || one.Events[0].Position != positions[1] || one.Events[1].Position != positions[3] {
		t.Fatalf("items: %+v %v", one, err)
	}
	head, err := client.Head(ctx)
	if err != nil || head < positions[4] {
		t.Fatalf("head %d %v", head, err)
	}
}

func TestEventsKeepTheirBytesIdsAndMetadata(t *testing.T) {
	client, ctx := server(t), context10s(t)
	tag := unique("blob")
	data := []byte{0, 0xff, 0xfe, 'a', 0x80}
	id := "4a2b0d4e-7c1f-4e0a-9a51-1f6d2c3b4a5e"
	_, err := client.Append(ctx, []annals.Event{{
		Type: "Stored", Tags: []string{tag}, Data: data, ID: id,
		Metadata: []byte(`{"causation":"c-1"}`),
	}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	read, err := client.Read(ctx, annals.Tags(tag), annals.ReadOptions{})
	if err != nil || len(read.Events) != 1 {
		t.Fatalf("%+v %v", read, err)
	}
	e := read.Events[0]
	if !bytes.Equal(e.Data, data) || e.ID != id || string(e.Metadata) != `{"causation":"c-1"}` {
		t.Fatalf("%+v", e)
	}
}

func TestAConditionThatFailsNamesTheConflictingPosition(t *testing.T) {
	client, ctx := server(t), context10s(t)
	tag := unique("user")
	registered := []annals.Event{{Type: "Registered", Tags: []string{tag}, Data: []byte("{}")}}
	q := annals.Tags(tag)
	first, err := client.Append(ctx, registered, &annals.Condition{FailIfEventsMatch: q})
	if err != nil {
		t.Fatal(err)
	}
	_, err = client.Append(ctx, registered, &annals.Condition{FailIfEventsMatch: q})
	var failed *annals.ConditionFailedError
	if !errors.As(err, &failed) || failed.Position != first || !errors.Is(err, annals.ErrConditionFailed) {
		t.Fatalf("expected a failed condition at %d: %v", first, err)
	}
	// After the conflicting position the condition holds again.
	second, err := client.Append(ctx, registered, annals.After(q, first))
	if err != nil || second <= first {
		t.Fatalf("%d %v", second, err)
	}
	read, _ := client.Read(ctx, q, annals.ReadOptions{})
	if len(read.Events) != 2 {
		t.Fatalf("the refused append stored something: %+v", read.Events)
	}
}

func TestBadInputGetsTypedErrorsAndStoresNothing(t *testing.T) {
	client, ctx := server(t), context10s(t)
	tag := unique("bad")
	cases := []struct {
		name  string
		event annals.Event
		class error
		kind  string
	}{
		{"an empty tag", annals.Event{Type: "X", Tags: []string{tag, ""}}, annals.ErrInvalidInput, "invalid_tag"},
		{"an empty type", annals.Event{Type: "", Tags: []string{tag}}, annals.ErrInvalidInput, "invalid_type"},
		{"an oversized event", annals.Event{Type: "X", Tags: []string{tag}, Data: bytes.Repeat([]byte("x"), 2<<20)}, annals.ErrTooLarge, ""},
	}
	for _, c := range cases {
		_, err := client.Append(ctx, []annals.Event{c.event}, nil)
		var refused *annals.Error
		if !errors.As(err, &refused) || !errors.Is(err, c.class) {
			t.Fatalf("%s: expected %v, got %v", c.name, c.class, err)
		}
		if c.kind != "" && refused.Kind != c.kind {
			t.Fatalf("%s: kind %q", c.name, refused.Kind)
		}
		if refused.Message == "" {
			t.Fatalf("%s: no message", c.name)
		}
	}
	read, err := client.Read(ctx, annals.Tags(tag), annals.ReadOptions{})
	if err != nil || len(read.Events) != 0 {
		t.Fatalf("refused appends stored %+v (%v)", read.Events, err)
	}
	// A read of a bad query is refused the same way.
	_, err = client.Read(ctx, annals.Tags(""), annals.ReadOptions{})
	if !errors.Is(err, annals.ErrInvalidInput) {
		t.Fatalf("an empty tag in a query: %v", err)
	}
}

func TestAServerThatIsDownIsUnreachable(t *testing.T) {
	listener, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	address := listener.Addr().String()
	listener.Close()
	client, err := annals.New("http://" + address)
	if err != nil {
		t.Fatal(err)
	}
	_, err = client.Append(context10s(t), []annals.Event{{Type: "X"}}, nil)
	var unreachable *annals.UnreachableError
	if !errors.As(err, &unreachable) || !errors.Is(err, annals.ErrUnreachable) {
		t.Fatalf("expected unreachable: %v", err)
	}
	if _, err := annals.New("localhost:7400"); err == nil {
		t.Fatal("a URL without a scheme was taken")
	}
}

// proxy forwards connections to the server until cut, which drops every connection it
// carries (as a restart or a network fault would).
type proxy struct {
	listener net.Listener
	mu       sync.Mutex
	conns    []net.Conn
}

func startProxy(t *testing.T, target string) *proxy {
	listener, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{listener: listener}
	go func() {
		for {
			conn, err := listener.Accept()
			if err != nil {
				return
			}
			upstream, err := net.Dial("tcp", target)
			if err != nil {
				conn.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, conn, upstream)
			p.mu.Unlock()
			go func() { io.Copy(upstream, conn); upstream.Close() }()
			go func() { io.Copy(conn, upstream); conn.Close() }()
		}
	}()
	t.Cleanup(func() { listener.Close(); p.cut() })
	return p
}

func (p *proxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
}

func TestASubscriptionResumesAfterADroppedConnection(t *testing.T) {
	direct, ctx := server(t), context10s(t)
	target := strings.TrimPrefix(os.Getenv("ANNALS_URL"), "http://")
	p := startProxy(t, target)
	client, _ := annals.New("http://" + p.listener.Addr().String())
	tag := unique("feed")
	appendOne := func(i int) uint64 {
		pos, err := direct.Append(ctx, []annals.Event{{Type: "Fed", Tags: []string{tag}, Data: []byte(fmt.Sprint(i))}}, nil)
		if err != nil {
			t.Fatal(err)
		}
		return pos
	}
	before := appendOne(0)
	var seen []string
	var positions []uint64
events:
	for e, err := range client.Subscribe(ctx, annals.Tags(tag), 0) {
		if err != nil {
			t.Fatalf("after %v: %v", seen, err)
		}
		seen = append(seen, string(e.Data))
		positions = append(positions, e.Position)
		switch len(seen) {
		case 1:
			if e.Position != before {
				t.Fatalf("first event at %d, appended at %d", e.Position, before)
			}
			appendOne(1)
		case 2:
			// The connection drops; events appended meanwhile arrive once it is taken up again.
			p.cut()
			appendOne(2)
			appendOne(3)
		case 4:
			break events
		}
	}
	if strings.Join(seen, ",") != "0,1,2,3" {
		t.Fatalf("delivered %v at %v", seen, positions)
	}
	for i := 1; i < len(positions); i++ {
		if positions[i] <= positions[i-1] {
			t.Fatalf("out of order: %v", positions)
		}
	}
}

func TestASubscriptionEndsWithItsContext(t *testing.T) {
	client := server(t)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	var last error
	for _, err := range client.Subscribe(ctx, annals.Tags(unique("quiet")), 0) {
		last = err
	}
	if !errors.Is(last, context.DeadlineExceeded) {
		t.Fatalf("ended with %v", last)
	}
}

func TestMetadataThatIsNotJSONTravelsAsItWas(t *testing.T) {
	client, ctx := server(t), context10s(t)
	tag := unique("raw")
	raw := []byte("not json \x01")
	if _, err := client.Append(ctx, []annals.Event{{Type: "Raw", Tags: []string{tag}, Metadata: raw}}, nil); err != nil {
		t.Fatal(err)
	}
	read, err := client.Read(ctx, annals.Tags(tag), annals.ReadOptions{})
	if err != nil || len(read.Events) != 1 || !bytes.Equal(read.Events[0].Metadata, raw) {
		t.Fatalf("%+v %v", read, err)
	}
	// What was read appends again unchanged.
	again := read.Events[0].Event
	again.Tags = []string{tag + "-copy"}
	if _, err := client.Append(ctx, []annals.Event{again}, nil); err != nil {
		t.Fatal(err)
	}
}
