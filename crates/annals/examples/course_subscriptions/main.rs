//! Course subscriptions (see README.md next to this file).
//!
//! The decision is the one `annals bench decide` measures and the concurrency test in
//! tests/decide.rs races; both include this file.

use annals::decide::{DecideError, Decided, Project, Projection, Retry, StateCache};
use annals::snapshot::{SnapshotPolicy, Snapshotted};
use annals::{Event, NewEvent, Query, QueryItem, Store};

/// How many courses one student may be subscribed to at a time.
pub const STUDENT_COURSE_LIMIT: usize = 3;

/// Why a command was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    CourseExists,
    NoSuchCourse,
    CourseFull {
        capacity: u32,
    },
    AlreadySubscribed,
    StudentAtLimit,
    NotSubscribed,
    /// A capacity below the students already subscribed.
    CapacityBelowSubscriptions {
        subscribed: u32,
    },
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::CourseExists => write!(f, "the course exists already"),
            Refusal::NoSuchCourse => write!(f, "no such course"),
            Refusal::CourseFull { capacity } => write!(f, "the course is full ({capacity} seats)"),
            Refusal::AlreadySubscribed => write!(f, "the student is subscribed already"),
            Refusal::StudentAtLimit => write!(
                f,
                "the student is subscribed to {STUDENT_COURSE_LIMIT} courses already"
            ),
            Refusal::NotSubscribed => write!(f, "the student is not subscribed"),
            Refusal::CapacityBelowSubscriptions { subscribed } => {
                write!(f, "{subscribed} students are subscribed already")
            }
        }
    }
}

pub type Outcome = Result<Decided, DecideError<Refusal>>;

fn course_tag(course: &str) -> String {
    format!("course:{course}")
}

fn student_tag(student: &str) -> String {
    format!("student:{student}")
}

fn number(event: &Event) -> u32 {
    std::str::from_utf8(event.data())
        .ok()
        .and_then(|d| d.parse().ok())
        .unwrap_or(0)
}

/// One course as far as subscriptions care.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Course {
    /// `None` until the course is defined.
    pub capacity: Option<u32>,
    pub subscribed: u32,
}

/// Everything tagged with the course: its definition, capacity changes, who joins and leaves.
pub fn course(course: &str) -> impl Project<State = Course> {
    Projection::new(
        Query::item(QueryItem::tags([course_tag(course)])),
        Course::default(),
        |state: &mut Course, event| match event.event_type() {
            "CourseDefined" | "CourseCapacityChanged" => state.capacity = Some(number(event)),
            "StudentSubscribed" => state.subscribed += 1,
            "StudentUnsubscribed" => state.subscribed = state.subscribed.saturating_sub(1),
            _ => {}
        },
    )
}

/// The courses a student is subscribed to now.
pub fn student_courses(student: &str) -> impl Project<State = Vec<String>> {
    Projection::new(
        Query::item(
            QueryItem::types(["StudentSubscribed", "StudentUnsubscribed"])
                .and_tags([student_tag(student)]),
        ),
        Vec::new(),
        |courses: &mut Vec<String>, event| {
            let Some(course) = event.tags().find_map(|t| t.strip_prefix("course:")) else {
                return;
            };
            match event.event_type() {
                "StudentSubscribed" => courses.push(course.to_owned()),
                _ => courses.retain(|c| c != course),
            }
        },
    )
}

pub fn define_course(store: &Store, id: &str, capacity: u32) -> Outcome {
    store.decide_and_append(&course(id), Retry::default(), |course| {
        if course.capacity.is_some() {
            return Err(Refusal::CourseExists);
        }
        Ok(vec![
            NewEvent::new("CourseDefined", capacity.to_string()).tag(course_tag(id))
        ])
    })
}

pub fn change_capacity(store: &Store, id: &str, capacity: u32) -> Outcome {
    store.decide_and_append(&course(id), Retry::default(), |course| {
        if course.capacity.is_none() {
            return Err(Refusal::NoSuchCourse);
        }
        if capacity < course.subscribed {
            return Err(Refusal::CapacityBelowSubscriptions {
                subscribed: course.subscribed,
            });
        }
        Ok(vec![NewEvent::new(
            "CourseCapacityChanged",
            capacity.to_string(),
        )
        .tag(course_tag(id))])
    })
}

/// Subscribes `student` to `course`: two projections, one read, one conditional append.
pub fn subscribe(store: &Store, course_id: &str, student: &str) -> Outcome {
    subscribe_with(store, course_id, student, Retry::default())
}

/// [`subscribe`] with a chosen retry policy.
pub fn subscribe_with(store: &Store, course_id: &str, student: &str, retry: Retry) -> Outcome {
    let decision = (course(course_id), student_courses(student));
    store.decide_and_append(&decision, retry, |state| rule(state, course_id, student))
}

/// Course states kept between decisions: with them, a subscription reads only the course's
/// events since the last decision on it, not its whole history.
pub type CourseCache = StateCache<Course>;

/// [`subscribe_with`], starting each course from the state `courses` kept.
pub fn subscribe_cached(
    store: &Store,
    courses: &CourseCache,
    course_id: &str,
    student: &str,
    retry: Retry,
) -> Outcome {
    let decision = (courses.cached(course(course_id)), student_courses(student));
    store.decide_and_append(&decision, retry, |state| rule(state, course_id, student))
}

/// A course whose state the store keeps as a snapshot: a decision reads only the course's
/// events since the snapshot, in any process and on any server of the store, and saves a new
/// one by `policy`. Raise the version (1) when the fold changes meaning.
pub fn snapshotted_course(
    course_id: &str,
    policy: SnapshotPolicy,
) -> Snapshotted<impl Project<State = Course>> {
    Snapshotted::new("course", 1, course(course_id)).policy(policy)
}

/// [`subscribe_with`], starting the course from its snapshot (the student's few events are
/// read whole).
pub fn subscribe_snapshotted(
    store: &Store,
    course_id: &str,
    student: &str,
    policy: SnapshotPolicy,
    retry: Retry,
) -> Outcome {
    let decision = (
        snapshotted_course(course_id, policy),
        student_courses(student),
    );
    store.decide_and_append(&decision, retry, |state| rule(state, course_id, student))
}

/// [`subscribe_snapshotted`] for async code (see [`subscribe_async`]).
pub async fn subscribe_snapshotted_async<S, F>(
    store: &Store,
    course_id: &str,
    student: &str,
    policy: SnapshotPolicy,
    retry: Retry,
    sleep: S,
) -> Outcome
where
    S: FnMut(std::time::Duration) -> F,
    F: std::future::Future<Output = ()>,
{
    let decision = (
        snapshotted_course(course_id, policy),
        student_courses(student),
    );
    store
        .decide_and_append_async(
            &decision,
            retry,
            |state| rule(state, course_id, student),
            sleep,
        )
        .await
}

/// The subscription rule, on the two projections' states.
fn rule(
    (course, joined): &(Course, Vec<String>),
    course_id: &str,
    student: &str,
) -> Result<Vec<NewEvent>, Refusal> {
    let capacity = course.capacity.ok_or(Refusal::NoSuchCourse)?;
    if joined.iter().any(|c| c == course_id) {
        return Err(Refusal::AlreadySubscribed);
    }
    if course.subscribed >= capacity {
        return Err(Refusal::CourseFull { capacity });
    }
    if joined.len() >= STUDENT_COURSE_LIMIT {
        return Err(Refusal::StudentAtLimit);
    }
    Ok(vec![NewEvent::new("StudentSubscribed", "")
        .tag(course_tag(course_id))
        .tag(student_tag(student))])
}

/// [`subscribe_cached`] for async code: `sleep` is the runtime's timer (for the backoff), e.g.
/// `tokio::time::sleep`. A cache of capacity 0 reads every course's whole history.
pub async fn subscribe_async<S, F>(
    store: &Store,
    courses: &CourseCache,
    course_id: &str,
    student: &str,
    retry: Retry,
    sleep: S,
) -> Outcome
where
    S: FnMut(std::time::Duration) -> F,
    F: std::future::Future<Output = ()>,
{
    let decision = (courses.cached(course(course_id)), student_courses(student));
    store
        .decide_and_append_async(
            &decision,
            retry,
            |state| rule(state, course_id, student),
            sleep,
        )
        .await
}

pub fn unsubscribe(store: &Store, course_id: &str, student: &str) -> Outcome {
    store.decide_and_append(&student_courses(student), Retry::default(), |joined| {
        if !joined.iter().any(|c| c == course_id) {
            return Err(Refusal::NotSubscribed);
        }
        Ok(vec![NewEvent::new("StudentUnsubscribed", "")
            .tag(course_tag(course_id))
            .tag(student_tag(student))])
    })
}

#[allow(dead_code)]
fn main() {
    let store = Store::open_in_memory(annals::Options::default()).expect("a memory store");
    let show = |what: &str, outcome: Outcome| match outcome {
        Ok(d) => println!("{what}: appended at {}", d.position),
        Err(e) => println!("{what}: {e}"),
    };
    show("define c1 with 2 seats", define_course(&store, "c1", 2));
    show("ada joins c1", subscribe(&store, "c1", "ada"));
    show("ada joins c1 again", subscribe(&store, "c1", "ada"));
    show("bob joins c1", subscribe(&store, "c1", "bob"));
    show("cy joins c1", subscribe(&store, "c1", "cy"));
    show("bob leaves c1", unsubscribe(&store, "c1", "bob"));
    show("cy joins c1", subscribe(&store, "c1", "cy"));
    show("c1 shrinks to 1 seat", change_capacity(&store, "c1", 1));
    show("c9 for ada", subscribe(&store, "c9", "ada"));
}
