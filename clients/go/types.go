package annals

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"time"
	"unicode/utf8"
)

// Event is an event to append: its type, its tags (each "key:value" by convention), its data,
// and optionally an id (a UUID, which makes a retried append recognisable as the same one)
// and metadata (JSON).
type Event struct {
	Type     string
	Tags     []string
	Data     []byte
	ID       string
	Metadata json.RawMessage
}

// SequencedEvent is an event as the store holds it: the event, its position in the log and
// when it was appended. Erased is true when its data subject was erased (Data is then empty).
type SequencedEvent struct {
	Event
	Position   uint64
	AppendedAt time.Time
	Erased     bool
}

// QueryItem matches events of any of its types (all types when none) that carry every one of
// its tags.
type QueryItem struct {
	Types []string `json:"types,omitempty"`
	Tags  []string `json:"tags,omitempty"`
}

// Query matches events that any of its items matches; a query with no items matches every
// event.
type Query struct {
	Items []QueryItem `json:"items"`
}

// All is the query that matches every event.
func All() Query { return Query{Items: []QueryItem{}} }

// Types is a query of one item: events of any of these types.
func Types(types ...string) Query { return Query{Items: []QueryItem{{Types: types}}} }

// Tags is a query of one item: events carrying all of these tags.
func Tags(tags ...string) Query { return Query{Items: []QueryItem{{Tags: tags}}} }

// Or is the query matching what q or item matches.
func (q Query) Or(item QueryItem) Query {
	items := append(append([]QueryItem{}, q.Items...), item)
	return Query{Items: items}
}

// Condition makes an append fail if any event matching FailIfEventsMatch was appended after
// position After (after any position when After is nil): the consistency boundary of a
// decision.
type Condition struct {
	FailIfEventsMatch Query
	After             *uint64
}

// After is a condition that fails if an event matching q was appended after position.
func After(q Query, position uint64) *Condition {
	return &Condition{FailIfEventsMatch: q, After: &position}
}

// ReadOptions say where a read starts, in which direction, and how many events it answers.
type ReadOptions struct {
	// From reads from this position on (inclusive); After reads after it (exclusive).
	From  *uint64
	After *uint64
	// Limit answers at most this many events (0: all).
	Limit uint64
	// Backwards reads from the newest event down.
	Backwards bool
}

type wireEvent struct {
	Type             string          `json:"type"`
	Tags             []string        `json:"tags"`
	Data             string          `json:"data"`
	DataEncoding     string          `json:"dataEncoding,omitempty"`
	ID               string          `json:"id,omitempty"`
	Metadata         json.RawMessage `json:"metadata,omitempty"`
	MetadataEncoding string          `json:"metadataEncoding,omitempty"`
	Position         uint64          `json:"position,omitempty"`
	AppendedAt       int64           `json:"appendedAt,omitempty"`
	Erased           bool            `json:"erased,omitempty"`
}

func toWire(e Event) wireEvent {
	w := wireEvent{Type: e.Type, Tags: e.Tags, ID: e.ID, Metadata: e.Metadata}
	if w.Tags == nil {
		w.Tags = []string{}
	}
	// Metadata that is not JSON (as another client may have stored it) travels in base64.
	if len(e.Metadata) > 0 && !json.Valid(e.Metadata) {
		encoded, _ := json.Marshal(base64.StdEncoding.EncodeToString(e.Metadata))
		w.Metadata = encoded
		w.MetadataEncoding = "base64"
	}
	// Data that is not UTF-8 travels in base64 and is stored as the bytes it decodes to.
	if utf8.Valid(e.Data) {
		w.Data = string(e.Data)
	} else {
		w.Data = base64.StdEncoding.EncodeToString(e.Data)
		w.DataEncoding = "base64"
	}
	return w
}

func fromWire(w wireEvent) (SequencedEvent, error) {
	e := SequencedEvent{
		Event: Event{
			Type:     w.Type,
			Tags:     w.Tags,
			Data:     []byte(w.Data),
			ID:       w.ID,
			Metadata: w.Metadata,
		},
		Position:   w.Position,
		AppendedAt: time.UnixMicro(w.AppendedAt).UTC(),
		Erased:     w.Erased,
	}
	if w.DataEncoding == "base64" {
		data, err := base64.StdEncoding.DecodeString(w.Data)
		if err != nil {
			return e, fmt.Errorf("annals: event at %d: data is not base64: %w", w.Position, err)
		}
		e.Data = data
	}
	if w.MetadataEncoding == "base64" {
		var text string
		if err := json.Unmarshal(w.Metadata, &text); err != nil {
			return e, fmt.Errorf("annals: event at %d: metadata is not base64: %w", w.Position, err)
		}
		raw, err := base64.StdEncoding.DecodeString(text)
		if err != nil {
			return e, fmt.Errorf("annals: event at %d: metadata is not base64: %w", w.Position, err)
		}
		e.Metadata = raw
	}
	return e, nil
}

type wireCondition struct {
	FailIfEventsMatch Query   `json:"failIfEventsMatch"`
	After             *uint64 `json:"after,omitempty"`
}

type wireAppend struct {
	Events    []wireEvent    `json:"events"`
	Condition *wireCondition `json:"condition,omitempty"`
}

type wireAppended struct {
	AppendConditionFailed bool    `json:"appendConditionFailed"`
	Position              *uint64 `json:"position"`
	ConflictPosition      *uint64 `json:"conflictPosition"`
}

type wireOptions struct {
	From      *uint64 `json:"from,omitempty"`
	After     *uint64 `json:"after,omitempty"`
	Limit     *uint64 `json:"limit,omitempty"`
	Backwards bool    `json:"backwards,omitempty"`
}
