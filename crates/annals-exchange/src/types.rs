//! The engine's vocabulary: commands in, reports out. Everything is an integer: prices in ticks
//! of the symbol's currency unit, quantities in units, ids chosen by the caller (time and ids
//! are inputs, so the same commands always produce the same reports).

pub type OrderId = u64;
pub type AccountId = u64;
pub type SymbolId = u32;
pub type Price = u64;
pub type Qty = u64;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Side {
    Buy,
    Sell,
}

impl Side {
    pub fn opposite(self) -> Side {
        match self {
            Side::Buy => Side::Sell,
            Side::Sell => Side::Buy,
        }
    }
}

/// How an order meets the book.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// Good till cancelled: takes what crosses, rests the rest.
    Limit,
    /// Takes whatever is there at any price; never rests.
    Market,
    /// Immediate or cancel: takes what crosses up to its limit, cancels the rest.
    Ioc,
    /// Fill or kill: fills whole at prices up to its limit, or is rejected untouched.
    Fok,
    /// Rests only: rejected if it would take.
    PostOnly,
}

/// Self-trade prevention: what happens when a taker meets a resting order of its own account.
/// The taker's mode governs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Stp {
    /// Self-trades are allowed.
    Allow,
    /// The taker's remaining quantity is cancelled.
    CancelNewest,
    /// The resting order is cancelled and matching goes on.
    CancelOldest,
    /// Both are cancelled.
    CancelBoth,
    /// Both are reduced by the smaller quantity, without a trade.
    Decrement,
}

/// A symbol's trading rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SymbolSpec {
    /// Prices are multiples of this.
    pub tick: Price,
    /// Quantities are multiples of this.
    pub lot: Qty,
}

/// A new order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Place {
    pub id: OrderId,
    /// The client's own id: unique among the account's live orders.
    pub client_id: u64,
    pub account: AccountId,
    pub symbol: SymbolId,
    pub side: Side,
    pub kind: Kind,
    /// The limit; ignored for market orders.
    pub price: Price,
    pub qty: Qty,
    pub stp: Stp,
}

impl Place {
    /// A good-till-cancelled limit order whose client id is its id and whose self-trades
    /// cancel the newest order: the common case; set other fields with struct update syntax
    /// (`Place { kind: Kind::Ioc, ..Place::limit(..) }`).
    pub fn limit(
        id: OrderId,
        account: AccountId,
        symbol: SymbolId,
        side: Side,
        price: Price,
        qty: Qty,
    ) -> Place {
        Place {
            id,
            client_id: id,
            account,
            symbol,
            side,
            kind: Kind::Limit,
            price,
            qty,
            stp: Stp::CancelNewest,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    Place(Place),
    Cancel {
        id: OrderId,
        account: AccountId,
    },
    /// A new price and remaining quantity. A decrease at the same price keeps the order's
    /// place in its queue; a price change or an increase moves it to the back (and may trade).
    Amend {
        id: OrderId,
        account: AccountId,
        price: Price,
        qty: Qty,
    },
    /// Cancels every live order of the account (in one symbol, or all).
    CancelAll {
        account: AccountId,
        symbol: Option<SymbolId>,
    },
}

/// Why a command was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reject {
    UnknownSymbol,
    InvalidPrice,
    InvalidQuantity,
    DuplicateOrderId,
    DuplicateClientOrderId,
    /// A post-only order (or its amendment) would have taken liquidity.
    WouldTake,
    /// A fill-or-kill order could not be filled whole.
    NotFillable,
    UnknownOrder,
    AlreadyFilled,
    AlreadyCancelled,
    NotOwner,
}

/// Why quantity was cancelled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CancelReason {
    /// The owner asked (cancel or cancel-all).
    Requested,
    /// Self-trade prevention.
    SelfTrade,
    /// What an IOC or market order could not fill.
    Unfilled,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    Maker,
    Taker,
}

/// What the engine says about one command, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Report {
    Accepted {
        id: OrderId,
    },
    Rejected {
        /// The order the command named (the new one for a place).
        id: OrderId,
        reason: Reject,
    },
    /// A trade: printed at the resting (maker) order's price.
    Trade {
        symbol: SymbolId,
        price: Price,
        qty: Qty,
        maker: OrderId,
        taker: OrderId,
        taker_side: Side,
        time: u64,
    },
    /// One side of a trade; `leaves` 0 means filled.
    Fill {
        id: OrderId,
        account: AccountId,
        price: Price,
        qty: Qty,
        leaves: Qty,
        role: Role,
    },
    /// `qty` cancelled; `leaves` 0 means the order is done (a self-trade decrement leaves
    /// the rest live).
    Cancelled {
        id: OrderId,
        qty: Qty,
        leaves: Qty,
        reason: CancelReason,
    },
    Amended {
        id: OrderId,
        price: Price,
        qty: Qty,
    },
}

/// A live order as the engine holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OrderView {
    pub id: OrderId,
    pub client_id: u64,
    pub account: AccountId,
    pub symbol: SymbolId,
    pub side: Side,
    pub price: Price,
    pub leaves: Qty,
}

/// Where an order stands ([`crate::Engine::status`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OrderStatus {
    Live(OrderView),
    /// Filled whole.
    Filled,
    /// Done with quantity cancelled: by its owner, by self-trade prevention, or the unfilled
    /// rest of an IOC or market order.
    Cancelled,
    /// No order with this id was ever accepted (a rejected order is not).
    Unknown,
}

/// Best bid and offer: (price, total quantity at it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Bbo {
    pub bid: Option<(Price, Qty)>,
    pub ask: Option<(Price, Qty)>,
}
