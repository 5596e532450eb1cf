// Package annals is a client for Annals, an event store that implements Dynamic Consistency
// Boundaries (DCB), over its HTTP API: append with a condition, read a query, subscribe to
// what is appended, and decide (read, decide, append under the read's condition, retried on
// conflict). Every call takes a context; refusals are typed (see Error and the classes
// matched with errors.Is).
package annals

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
)

// Client talks to one Annals server. It is safe for concurrent use.
type Client struct {
	base   *url.URL
	http   *http.Client
	apiKey string
}

// Option configures a Client.
type Option func(*Client)

// WithAPIKey sends key as a bearer token with every request.
func WithAPIKey(key string) Option { return func(c *Client) { c.apiKey = key } }

// WithHTTPClient uses h for every request (its transport, TLS and timeouts). Subscriptions
// are long requests: h should not set an overall Timeout; contexts bound each call instead.
func WithHTTPClient(h *http.Client) Option { return func(c *Client) { c.http = h } }

// New makes a client of the server at baseURL (for example "http://127.0.0.1:7400").
func New(baseURL string, options ...Option) (*Client, error) {
	base, err := url.Parse(strings.TrimRight(baseURL, "/"))
	if err != nil {
		return nil, fmt.Errorf("annals: the server's URL %q: %w", baseURL, err)
	}
	if base.Scheme != "http" && base.Scheme != "https" {
		return nil, fmt.Errorf("annals: the server's URL %q: expected http:// or https://", baseURL)
	}
	c := &Client{base: base, http: http.DefaultClient}
	for _, o := range options {
		o(c)
	}
	return c, nil
}

func (c *Client) endpoint(path string, params url.Values) string {
	u := *c.base
	u.Path = c.base.Path + path
	u.RawQuery = params.Encode()
	return u.String()
}

// do sends a request and answers its response when the status is 2xx; any other status is
// read as the server's error body.
func (c *Client) do(ctx context.Context, method, path string, params url.Values, body any,
	accept string) (*http.Response, error) {
	var reader io.Reader
	if body != nil {
		encoded, err := json.Marshal(body)
		if err != nil {
			return nil, fmt.Errorf("annals: encoding the request: %w", err)
		}
		reader = bytes.NewReader(encoded)
	}
	target := c.endpoint(path, params)
	req, err := http.NewRequestWithContext(ctx, method, target, reader)
	if err != nil {
		return nil, fmt.Errorf("annals: %w", err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if accept != "" {
		req.Header.Set("Accept", accept)
	}
	if c.apiKey != "" {
		req.Header.Set("Authorization", "Bearer "+c.apiKey)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, &UnreachableError{URL: c.base.String(), Err: err}
	}
	if resp.StatusCode/100 != 2 {
		defer resp.Body.Close()
		return nil, readError(resp)
	}
	return resp, nil
}

func readError(resp *http.Response) error {
	text, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	var answer struct {
		Error      string      `json:"error"`
		Kind       string      `json:"kind"`
		Violations []Violation `json:"violations"`
	}
	if json.Unmarshal(text, &answer) != nil || answer.Kind == "" {
		answer.Kind = "http_" + strconv.Itoa(resp.StatusCode)
		answer.Error = strings.TrimSpace(string(text))
	}
	return &Error{
		Status:     resp.StatusCode,
		Kind:       answer.Kind,
		Message:    answer.Error,
		Violations: answer.Violations,
	}
}

// Append appends events, all or none, and answers the position of the last. With a
// condition, it fails with a *ConditionFailedError (errors.Is(err, ErrConditionFailed)) when
// an event matching the condition's query was appended after its position.
func (c *Client) Append(ctx context.Context, events []Event, condition *Condition) (uint64, error) {
	body := wireAppend{Events: make([]wireEvent, len(events))}
	for i, e := range events {
		body.Events[i] = toWire(e)
	}
	if condition != nil {
		body.Condition = &wireCondition{
			FailIfEventsMatch: normalized(condition.FailIfEventsMatch),
			After:             condition.After,
		}
	}
	resp, err := c.do(ctx, http.MethodPost, "/v1/append", nil, body, "")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	var answer wireAppended
	if err := json.NewDecoder(resp.Body).Decode(&answer); err != nil {
		// The append was taken and its answer lost on the way.
		return 0, &UnreachableError{URL: c.base.String(), Err: err}
	}
	if answer.AppendConditionFailed {
		position := uint64(0)
		if answer.ConflictPosition != nil {
			position = *answer.ConflictPosition
		}
		return 0, &ConditionFailedError{Position: position}
	}
	if answer.Position == nil {
		return 0, fmt.Errorf("annals: the append's answer has no position")
	}
	return *answer.Position, nil
}

// normalized gives a query's items as an array even when it has none.
func normalized(q Query) Query {
	if q.Items == nil {
		return All()
	}
	return q
}

func queryParams(q Query) (url.Values, error) {
	params := url.Values{}
	if len(q.Items) > 0 {
		encoded, err := json.Marshal(q)
		if err != nil {
			return nil, fmt.Errorf("annals: encoding the query: %w", err)
		}
		params.Set("query", string(encoded))
	}
	return params, nil
}

// Read is what a read answered: the events, and the head of the log when it was read (the
// position a decision's condition reads after).
type Read struct {
	Events []SequencedEvent
	Head   uint64
}

// Read answers the events q matches, as options say.
func (c *Client) Read(ctx context.Context, q Query, options ReadOptions) (Read, error) {
	params, err := queryParams(q)
	if err != nil {
		return Read{}, err
	}
	wire := wireOptions{From: options.From, After: options.After, Backwards: options.Backwards}
	if options.Limit > 0 {
		wire.Limit = &options.Limit
	}
	if wire != (wireOptions{}) {
		encoded, _ := json.Marshal(wire)
		params.Set("options", string(encoded))
	}
	resp, err := c.do(ctx, http.MethodGet, "/v1/read", params, nil, "application/x-ndjson")
	if err != nil {
		return Read{}, err
	}
	defer resp.Body.Close()
	head, err := strconv.ParseUint(resp.Header.Get("annals-head"), 10, 64)
	if err != nil {
		return Read{}, fmt.Errorf("annals: the read's answer has no head")
	}
	read := Read{Head: head, Events: []SequencedEvent{}}
	decoder := json.NewDecoder(resp.Body)
	for decoder.More() {
		var w wireEvent
		if err := decoder.Decode(&w); err != nil {
			if ctx.Err() != nil {
				return Read{}, ctx.Err()
			}
			return Read{}, &UnreachableError{URL: c.base.String(), Err: err}
		}
		e, err := fromWire(w)
		if err != nil {
			return Read{}, err
		}
		read.Events = append(read.Events, e)
	}
	return read, nil
}

// Head answers the position of the last event appended (0 for an empty log).
func (c *Client) Head(ctx context.Context) (uint64, error) {
	resp, err := c.do(ctx, http.MethodGet, "/v1/head", nil, nil, "")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	var answer struct {
		Head uint64 `json:"head"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&answer); err != nil {
		return 0, &UnreachableError{URL: c.base.String(), Err: err}
	}
	return answer.Head, nil
}
