"""A DCB application as the eventsourcing library's users write one: a dog school whose dogs
are registered (one decision appended under a condition) and taught tricks (the dog's
decisions read, then one appended under a condition on them). The benchmark
`bench/eventsourcing_app.py` drives it, and the test command's library suite
(crates/annals-cli/tests/python) checks what it reads back."""

from uuid import uuid4

from eventsourcing.domain import event
from eventsourcing.pydantic.application import DcbApplication
from eventsourcing.pydantic.immutable import Decision
from eventsourcing.pydantic.mutable import EnduringObject


class Dog(EnduringObject):
    class Registered(Decision):
        dog_id: str
        name: str

    class TrickAdded(Decision):
        dog_id: str
        trick: str

    @event(Registered)
    def __init__(self, *, dog_id: str, name: str) -> None:
        self.id = dog_id
        self.name = name
        self.tricks: list[str] = []

    @event(TrickAdded)
    def add_trick(self, trick: str) -> None:
        self.tricks.append(trick)


class School(DcbApplication):
    def register(self, name):
        dog = Dog(dog_id=str(uuid4()), name=name)
        self.repository.save(dog)
        return dog.id

    def teach(self, dog_id, trick):
        dog = self.repository.get(dog_id, Dog)
        dog.add_trick(trick)
        self.repository.save(dog)

    def get_dog(self, dog_id):
        dog = self.repository.get(dog_id, Dog)
        return {"name": dog.name, "tricks": tuple(dog.tricks)}
