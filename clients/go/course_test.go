package annals_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"

	"annals"
)

// The course subscription rule, decided across two consistency boundaries at once: a course
// takes at most its capacity of students, and a student takes at most a number of courses.
// One query covers both, so one condition guards both.

type subscriptions struct {
	courseTaken, studentTaken int
	already                   bool
}

var errCourseFull = errors.New("the course is full")
var errStudentBusy = errors.New("the student has too many courses")

func subscribe(ctx context.Context, client *annals.Client, course, student string, capacity, limit int) (annals.Decided, error) {
	courseTag, studentTag := "course:"+course, "student:"+student
	q := annals.Query{Items: []annals.QueryItem{
		{Types: []string{"StudentSubscribed"}, Tags: []string{courseTag}},
		{Types: []string{"StudentSubscribed"}, Tags: []string{studentTag}},
	}}
	fold := func(s subscriptions, e annals.SequencedEvent) subscriptions {
		inCourse, ofStudent := false, false
		for _, tag := range e.Tags {
			inCourse = inCourse || tag == courseTag
			ofStudent = ofStudent || tag == studentTag
		}
		if inCourse {
			s.courseTaken++
		}
		if ofStudent {
			s.studentTaken++
		}
		s.already = s.already || (inCourse && ofStudent)
		return s
	}
	command := func(s subscriptions) ([]annals.Event, error) {
		switch {
		case s.already:
			return nil, nil
		case s.courseTaken >= capacity:
			return nil, errCourseFull
		case s.studentTaken >= limit:
			return nil, errStudentBusy
		}
		data, _ := json.Marshal(map[string]string{"course": course, "student": student})
		return []annals.Event{{Type: "StudentSubscribed", Tags: []string{courseTag, studentTag}, Data: data}}, nil
	}
	return annals.Decide(ctx, client, q, subscriptions{}, fold, command, annals.DefaultRetry)
}

func TestTheLastSeatGoesToExactlyOneStudent(t *testing.T) {
	client, ctx := server(t), context10s(t)
	course := unique("c")
	for i := range 2 {
		if _, err := subscribe(ctx, client, course, fmt.Sprintf("%s-early-%d", course, i), 3, 5); err != nil {
			t.Fatal(err)
		}
	}
	// Eight students race for the one seat left.
	var wg sync.WaitGroup
	results := make([]error, 8)
	for i := range results {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, results[i] = subscribe(ctx, client, course, fmt.Sprintf("%s-racer-%d", course, i), 3, 5)
		}()
	}
	wg.Wait()
	won, full := 0, 0
	for _, err := range results {
		switch {
		case err == nil:
			won++
		case errors.Is(err, errCourseFull):
			full++
		default:
			t.Fatalf("unexpected: %v", err)
		}
	}
	if won != 1 || full != 7 {
		t.Fatalf("%d won the last seat, %d found the course full", won, full)
	}
	read, _ := client.Read(ctx, annals.Tags("course:"+course), annals.ReadOptions{})
	if len(read.Events) != 3 {
		t.Fatalf("the course holds %d students", len(read.Events))
	}
}

func TestAStudentsLimitHoldsAcrossCourses(t *testing.T) {
	client, ctx := server(t), context10s(t)
	student := unique("s")
	for i := range 2 {
		if _, err := subscribe(ctx, client, fmt.Sprintf("%s-%d", student, i), student, 10, 2); err != nil {
			t.Fatal(err)
		}
	}
	_, err := subscribe(ctx, client, student+"-2", student, 10, 2)
	if !errors.Is(err, errStudentBusy) {
		t.Fatalf("a third course: %v", err)
	}
	// Subscribing again to a course already taken appends nothing.
	decided, err := subscribe(ctx, client, student+"-0", student, 10, 2)
	if err != nil || decided.Position != 0 {
		t.Fatalf("%+v %v", decided, err)
	}
}
